// Added to go-waku's api/history package when the status-go harness is
// built (gowaku_build.py): NewStorenodeCycle takes a Pinger and never
// assigns it (cycle.go), so a cycle without a pinned storenode calls a nil
// Pinger when it pings the fleet. SetPinger sets the field the constructor
// leaves unset; nothing else in go-waku changes.
package history

import "github.com/waku-org/go-waku/waku/v2/api/common"

// SetPinger sets the pinger the cycle pings storenodes with.
func (m *StorenodeCycle) SetPinger(pinger common.Pinger) {
	m.pinger = pinger
}
