// Added to go-waku's timesource package at build time (go build -overlay):
// the node asks no NTP server, so the tests' nodes send nothing beyond
// loopback (an empty server list gives a zero offset, the local clock).
package timesource

func init() {
	DefaultServers = nil
}
