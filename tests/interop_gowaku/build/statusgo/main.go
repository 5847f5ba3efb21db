// Command statusgo runs status-go's store client against store nodes given
// by multiaddr: the packages of go-waku's waku/v2/api that status-go builds
// it from (history.StorenodeCycle, history.HistoryRetriever,
// missing.MissingMessageVerifier, publish.MessageSentCheck behind
// publish.MessageSender), on a go-waku node set up as status-go sets up its
// own (wakuv2/waku.go: cluster, light client or relay, the store client's
// default rate limit).
//
// A run does one of three things (-mode); it prints one JSON object on
// stdout (the summary type below) and go-waku's log on stderr, and exits 1
// when the goal was not reached within -timeout or when any component
// logged at error level, 2 on bad arguments.
//
//	missing  the missing-message verifier over -content-topics of
//	         -pubsub-topic: pages of hashes (include_data false, 100 a page)
//	         of each window, then the bodies of the hashes the client lacks
//	         by hash, 50 a request. The client holds the hashes in -known
//	         from the start (as if relay had brought them). Done when every
//	         hash in -expect was delivered, plus -settle to see whether any
//	         arrives twice.
//	sent     publishes -count messages (relay; lightpush with -light) over
//	         -content-topics and lets the sent check ask the active
//	         storenode for their hashes (every 3 s, 50 a request) until
//	         each is stored or expired.
//	history  the history retriever over [-from, -to) (Unix seconds) in
//	         windows of 24 hours, newest first, -content-topics split by 10,
//	         pages of 50 followed to the end, on the active storenode;
//	         -passes 2 then switches storenode (Cycle, as status-go does
//	         when it changes storenode) and runs the windows again.
//
// The storenodes are -store (comma-separated); the cycle pings them all and
// picks one among the fastest (history.StorenodeCycle.findNewStorenode).
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	apicommon "github.com/waku-org/go-waku/waku/v2/api/common"
	"github.com/waku-org/go-waku/waku/v2/api/history"
	"github.com/waku-org/go-waku/waku/v2/node"
	wps "github.com/waku-org/go-waku/waku/v2/peerstore"
	"github.com/waku-org/go-waku/waku/v2/protocol"
	"github.com/waku-org/go-waku/waku/v2/protocol/lightpush"
	"github.com/waku-org/go-waku/waku/v2/protocol/pb"
	"github.com/waku-org/go-waku/waku/v2/protocol/store"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// status-go's page size and window for history requests.
const historyPageLimit = 50
const historyWindow = 24 * time.Hour

type config struct {
	mode          string
	stores        []string
	clusterID     uint
	pubsubTopic   string
	contentTopics []string
	light         bool
	expect        []pb.MessageHash
	known         []pb.MessageHash
	delay         time.Duration
	interval      time.Duration
	settle        time.Duration
	count         int
	from, to      int64
	passes        int
	timeout       time.Duration
	logLevel      zapcore.Level
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "statusgo:", err)
		os.Exit(2)
	}
	out := run(cfg)
	encoder := json.NewEncoder(os.Stdout)
	if err := encoder.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "statusgo:", err)
		os.Exit(1)
	}
	if len(out.Errors) > 0 {
		os.Exit(1)
	}
}

func parseFlags(args []string) (*config, error) {
	flags := flag.NewFlagSet("statusgo", flag.ContinueOnError)
	cfg := &config{}
	var stores, topics, expect, known, level string
	flags.StringVar(&cfg.mode, "mode", "", "missing, sent or history")
	flags.StringVar(&stores, "store", "", "storenode multiaddrs, comma-separated")
	flags.UintVar(&cfg.clusterID, "cluster", 16, "cluster id")
	flags.StringVar(&cfg.pubsubTopic, "pubsub-topic", "/waku/2/rs/16/32", "pubsub topic (a static shard)")
	flags.StringVar(&topics, "content-topics", "", "content topics, comma-separated")
	flags.BoolVar(&cfg.light, "light", false, "light client (filter light node, lightpush) instead of relay")
	flags.StringVar(&expect, "expect", "", "file of hex message hashes the storenodes hold")
	flags.StringVar(&known, "known", "", "file of hex message hashes the client already has (missing)")
	flags.DurationVar(&cfg.delay, "delay", 20*time.Second, "the verifier's delay (missing)")
	flags.DurationVar(&cfg.interval, "interval", time.Minute, "the verifier's interval (missing)")
	flags.DurationVar(&cfg.settle, "settle", 2*time.Second, "how long to watch after the goal (missing)")
	flags.IntVar(&cfg.count, "count", 60, "messages to publish (sent)")
	flags.Int64Var(&cfg.from, "from", 0, "start of the history range, Unix seconds (history)")
	flags.Int64Var(&cfg.to, "to", 0, "end of the history range, Unix seconds (history)")
	flags.IntVar(&cfg.passes, "passes", 1, "history passes, each after the first on a new storenode")
	flags.DurationVar(&cfg.timeout, "timeout", 60*time.Second, "give up after")
	flags.StringVar(&level, "log-level", "info", "go-waku's log level on stderr")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	if cfg.mode != "missing" && cfg.mode != "sent" && cfg.mode != "history" {
		return nil, fmt.Errorf("unknown -mode %q", cfg.mode)
	}
	cfg.stores = splitList(stores)
	cfg.contentTopics = splitList(topics)
	if len(cfg.stores) == 0 || len(cfg.contentTopics) == 0 {
		return nil, errors.New("-store and -content-topics are required")
	}
	var err error
	if cfg.expect, err = readHashes(expect); err != nil {
		return nil, err
	}
	if cfg.known, err = readHashes(known); err != nil {
		return nil, err
	}
	if cfg.logLevel, err = zapcore.ParseLevel(level); err != nil {
		return nil, err
	}
	return cfg, nil
}

// --- a run -------------------------------------------------------------------

type harness struct {
	cfg     *config
	log     *zap.Logger
	node    *node.WakuNode
	cycle   *history.StorenodeCycle
	rec     *recorder
	out     *summary
	changed chan peer.ID
}

func run(cfg *config) *summary {
	started := time.Now()
	errorLog := &lineBuffer{}
	logger := newLogger(cfg.logLevel, errorLog)
	out := &summary{Mode: cfg.mode, Expected: len(cfg.expect), Known: len(cfg.known), Missing: []string{}, Sent: []string{}, Passes: []pass{}}
	rec := &recorder{pings: make(map[string]string), requests: []request{}, storenodes: []string{}}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()

	h := &harness{cfg: cfg, log: logger, rec: rec, out: out}
	err := h.start(ctx)
	if err == nil {
		switch cfg.mode {
		case "missing":
			err = h.missing(ctx)
		case "sent":
			err = h.sent(ctx)
		case "history":
			err = h.history(ctx)
		}
	}
	// What the node logs while it stops (its listen addresses going away)
	// is no error of the store client.
	out.Errors = errorLog.lines()
	if h.node != nil {
		h.node.Stop()
	}
	_ = logger.Sync()

	rec.mu.Lock()
	out.Requests, out.Storenodes, out.Pings = rec.requests, rec.storenodes, rec.pings
	rec.mu.Unlock()
	if err != nil {
		out.Errors = append(out.Errors, "statusgo: "+err.Error())
	}
	out.ElapsedS = time.Since(started).Seconds()
	return out
}

// start runs the go-waku node, adds the storenodes to its peer store (as
// status-go adds its fleet's: wps.Static, the store protocol) and starts
// the storenode cycle.
func (h *harness) start(ctx context.Context) error {
	var shard protocol.StaticShardingPubsubTopic
	if err := shard.Parse(h.cfg.pubsubTopic); err != nil {
		return err
	}
	var err error
	options := []node.WakuNodeOption{
		node.WithLogger(h.log),
		node.WithHostAddress(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 0}),
		node.WithClusterID(uint16(h.cfg.clusterID)),
		node.WithMaxMsgSize(1024 * 1024),
	}
	if h.cfg.light {
		options = append(options, node.WithWakuFilterLightNode(), node.WithShards([]uint16{shard.Shard()}))
	} else {
		options = append(options, node.WithWakuRelayAndMinPeers(1))
	}
	h.node, err = node.New(options...)
	if err != nil {
		return err
	}
	if err := h.node.Start(ctx); err != nil {
		return err
	}
	if !h.cfg.light {
		if _, err := h.node.Relay().Subscribe(ctx, protocol.NewContentFilter(h.cfg.pubsubTopic)); err != nil {
			return err
		}
	}
	var nodes []peer.AddrInfo
	for _, address := range h.cfg.stores {
		addr, err := multiaddr.NewMultiaddr(address)
		if err != nil {
			return err
		}
		info, err := peer.AddrInfoFromP2pAddr(addr)
		if err != nil {
			return err
		}
		if _, err := h.node.AddPeer(addr, wps.Static, []string{h.cfg.pubsubTopic}, store.StoreQueryID_v300, lightpush.LightPushID_v20beta1); err != nil {
			return err
		}
		if err := h.node.DialPeerWithMultiAddress(ctx, addr); err != nil {
			return err
		}
		nodes = append(nodes, *info)
	}

	pinger := &recordingPinger{inner: apicommon.NewDefaultPinger(h.node.Host()), rec: h.rec}
	h.cycle = history.NewStorenodeCycle(h.log, pinger)
	// go-waku at this version drops NewStorenodeCycle's pinger argument:
	// the build adds SetPinger (testdata/storenode_pinger.go) to keep it.
	h.cycle.SetPinger(pinger)
	h.cycle.SetStorenodeConfigProvider(fleet{nodes: nodes})
	// The cycle's emitters block until each subscriber reads.
	h.changed = make(chan peer.ID, 16)
	changes := h.cycle.StorenodeChangedEmitter.Subscribe()
	go func() {
		for {
			select {
			case id := <-changes:
				if id != "" {
					h.rec.storenode(id)
					select {
					case h.changed <- id:
					default:
					}
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	h.cycle.Start(ctx)
	if !h.cycle.WaitForAvailableStoreNode(ctx) {
		return errors.New("no storenode became available")
	}
	return nil
}

func hashSet(hashes []pb.MessageHash) map[pb.MessageHash]bool {
	set := make(map[pb.MessageHash]bool, len(hashes))
	for _, h := range hashes {
		set[h] = true
	}
	return set
}

func splitList(value string) []string {
	var items []string
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// readHashes reads hex message hashes, one a line; "" reads none.
func readHashes(path string) ([]pb.MessageHash, error) {
	if path == "" {
		return nil, nil
	}
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var hashes []pb.MessageHash
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		raw, err := hex.DecodeString(strings.TrimPrefix(line, "0x"))
		if err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("%s: not a message hash: %q", path, line)
		}
		hashes = append(hashes, pb.ToMessageHash(raw))
	}
	return hashes, scanner.Err()
}
