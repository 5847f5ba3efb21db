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
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	apicommon "github.com/waku-org/go-waku/waku/v2/api/common"
	"github.com/waku-org/go-waku/waku/v2/api/history"
	"github.com/waku-org/go-waku/waku/v2/api/missing"
	"github.com/waku-org/go-waku/waku/v2/api/publish"
	"github.com/waku-org/go-waku/waku/v2/node"
	wps "github.com/waku-org/go-waku/waku/v2/peerstore"
	"github.com/waku-org/go-waku/waku/v2/protocol"
	"github.com/waku-org/go-waku/waku/v2/protocol/lightpush"
	"github.com/waku-org/go-waku/waku/v2/protocol/pb"
	"github.com/waku-org/go-waku/waku/v2/protocol/store"
	storepb "github.com/waku-org/go-waku/waku/v2/protocol/store/pb"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
)

// status-go's history page size (messenger_mailserver.go) and window.
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

// --- what a run reports ------------------------------------------------------

// request is one Store v3 request the api made, with what came back.
type request struct {
	Peer          string `json:"peer"`
	IncludeData   bool   `json:"include_data"`
	Hashes        int    `json:"hashes"`
	ContentTopics int    `json:"content_topics"`
	Limit         uint64 `json:"limit"`
	Forward       bool   `json:"forward"`
	Cursor        bool   `json:"cursor"`
	TimeStart     int64  `json:"time_start,omitempty"`
	TimeEnd       int64  `json:"time_end,omitempty"`
	Messages      int    `json:"messages"`
}

// pass is one run of the history windows on one storenode.
type pass struct {
	Storenode  string `json:"storenode"`
	Windows    int    `json:"windows"`
	Delivered  int    `json:"delivered"`
	Found      int    `json:"found"`
	Duplicates int    `json:"duplicates"`
}

type summary struct {
	Mode     string `json:"mode"`
	Expected int    `json:"expected"`
	Known    int    `json:"known"`
	// Expected hashes the client has at the end (missing, history: the
	// last pass) or saw stored (sent).
	Found int `json:"found"`
	// Messages delivered by the api (missing: bodies fetched by hash;
	// history: envelopes of the last pass), and how many of those the
	// client had already.
	Fetched    int `json:"fetched"`
	Duplicates int `json:"duplicates"`
	// Delivered messages whose hash is not in -expect.
	Unexpected int      `json:"unexpected"`
	Missing    []string `json:"missing"`
	// sent: the hashes published, and what the sent check said of them.
	Sent    []string `json:"sent"`
	Stored  int      `json:"stored"`
	Expired int      `json:"expired"`
	Passes  []pass   `json:"passes"`
	// The active storenode after each change, in order; the ping of each.
	Storenodes []string          `json:"storenodes"`
	Pings      map[string]string `json:"pings"`
	Requests   []request         `json:"requests"`
	Errors     []string          `json:"errors"`
	ElapsedS   float64           `json:"elapsed_s"`
}

// recorder collects what the api does, from its own goroutines.
type recorder struct {
	mu         sync.Mutex
	requests   []request
	storenodes []string
	pings      map[string]string
}

func (r *recorder) request(peerID peer.ID, q *storepb.StoreQueryRequest, cursor bool, messages int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, request{
		Peer:          peerID.String(),
		IncludeData:   q.IncludeData,
		Hashes:        len(q.MessageHashes),
		ContentTopics: len(q.ContentTopics),
		Limit:         q.GetPaginationLimit(),
		Forward:       q.PaginationForward,
		Cursor:        cursor,
		TimeStart:     q.GetTimeStart(),
		TimeEnd:       q.GetTimeEnd(),
		Messages:      messages,
	})
}

func (r *recorder) storenode(id peer.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.storenodes = append(r.storenodes, id.String())
}

func (r *recorder) ping(id peer.ID, rtt time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.pings[id.String()] = "error: " + err.Error()
	} else {
		r.pings[id.String()] = rtt.String()
	}
}

// recordingRequestor is the api's default StorenodeRequestor (go-waku's
// store client), recording each request: the first page through Query,
// the next ones through the result's Next.
type recordingRequestor struct {
	inner apicommon.StorenodeRequestor
	rec   *recorder
}

func (r *recordingRequestor) Query(ctx context.Context, peerID peer.ID, q *storepb.StoreQueryRequest) (apicommon.StoreRequestResult, error) {
	result, err := r.inner.Query(ctx, peerID, q)
	if err != nil {
		return nil, err
	}
	// The history retriever sends each next page as a new query with the
	// cursor; the verifier calls the result's Next.
	r.rec.request(peerID, q, len(q.PaginationCursor) > 0, len(result.Messages()))
	return &recordingResult{StoreRequestResult: result, query: q, rec: r.rec}, nil
}

type recordingResult struct {
	apicommon.StoreRequestResult
	query *storepb.StoreQueryRequest
	rec   *recorder
}

func (r *recordingResult) Next(ctx context.Context, opts ...store.RequestOption) error {
	// Without a cursor Next sends nothing: it marks the result complete.
	asked := r.Cursor() != nil
	if err := r.StoreRequestResult.Next(ctx, opts...); err != nil {
		return err
	}
	if asked {
		r.rec.request(r.PeerID(), r.query, true, len(r.Messages()))
	}
	return nil
}

// recordingVerifier is publish's default StorenodeMessageVerifier, recorded.
type recordingVerifier struct {
	inner publish.StorenodeMessageVerifier
	rec   *recorder
}

func (v *recordingVerifier) MessageHashesExist(ctx context.Context, requestID []byte, peerID peer.ID, pageSize uint64, hashes []pb.MessageHash) ([]pb.MessageHash, error) {
	found, err := v.inner.MessageHashesExist(ctx, requestID, peerID, pageSize, hashes)
	if err != nil {
		return nil, err
	}
	raw := make([][]byte, len(hashes))
	for i := range hashes {
		raw[i] = hashes[i].Bytes()
	}
	v.rec.request(peerID, &storepb.StoreQueryRequest{MessageHashes: raw, PaginationLimit: proto.Uint64(pageSize)}, false, len(found))
	return found, nil
}

type recordingPinger struct {
	inner apicommon.Pinger
	rec   *recorder
}

func (p *recordingPinger) PingPeer(ctx context.Context, info peer.AddrInfo) (time.Duration, error) {
	rtt, err := p.inner.PingPeer(ctx, info)
	p.rec.ping(info.ID, rtt, err)
	return rtt, err
}

// fleet is the cycle's StorenodeConfigProvider: no pinned storenode, so
// the cycle chooses among all of them.
type fleet struct{ nodes []peer.AddrInfo }

func (f fleet) UseStorenodes() (bool, error)               { return true, nil }
func (f fleet) GetPinnedStorenode() (peer.AddrInfo, error) { return peer.AddrInfo{}, nil }
func (f fleet) Storenodes() ([]peer.AddrInfo, error)       { return f.nodes, nil }

// cache is the client's envelope cache (status-go's envelopeCache): the
// verifier's MessageTracker, filled by what the api delivers.
type cache struct {
	mu         sync.Mutex
	seen       map[pb.MessageHash]bool
	delivered  int
	duplicates int
}

func newCache(known []pb.MessageHash) *cache {
	c := &cache{seen: make(map[pb.MessageHash]bool)}
	for _, h := range known {
		c.seen[h] = true
	}
	return c
}

func (c *cache) MessageExists(h pb.MessageHash) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[h], nil
}

func (c *cache) add(h pb.MessageHash) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delivered++
	if c.seen[h] {
		c.duplicates++
	}
	c.seen[h] = true
}

func (c *cache) holds(hashes []pb.MessageHash) (found int, missing []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	missing = []string{}
	for _, h := range hashes {
		if c.seen[h] {
			found++
		} else {
			missing = append(missing, hex.EncodeToString(h.Bytes()))
		}
	}
	return found, missing
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

// missing runs the verifier on the active storenode until it has
// delivered every expected message, then watches -settle longer.
func (h *harness) missing(ctx context.Context) error {
	tracker := newCache(h.cfg.known)
	requestor := &recordingRequestor{inner: missing.NewDefaultStorenodeRequestor(h.node.Store()), rec: h.rec}
	verifier := missing.NewMissingMessageVerifier(
		requestor, tracker, h.node.Timesource(), h.log,
		missing.WithDelay(h.cfg.delay), missing.WithVerificationInterval(h.cfg.interval),
	)
	verifier.Start(ctx)
	verifier.SetCriteriaInterest(h.cycle.GetActiveStorenode(), protocol.NewContentFilter(h.cfg.pubsubTopic, h.cfg.contentTopics...))

	expected := hashSet(h.cfg.expect)
	unexpected := 0
	var done <-chan time.Time
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	var err error
loop:
	for {
		select {
		case envelope := <-verifier.C:
			// status-go hands each to OnNewEnvelopes, which caches it.
			tracker.add(envelope.Hash())
			if !expected[envelope.Hash()] {
				unexpected++
			}
		case <-ticker.C:
			if done == nil {
				if found, _ := tracker.holds(h.cfg.expect); found == len(h.cfg.expect) {
					done = time.After(h.cfg.settle)
				}
			}
		case <-done:
			break loop
		case <-ctx.Done():
			err = errors.New("timed out before every expected message was delivered")
			break loop
		}
	}
	h.out.Found, h.out.Missing = tracker.holds(h.cfg.expect)
	h.out.Fetched, h.out.Duplicates, h.out.Unexpected = tracker.delivered, tracker.duplicates, unexpected
	return err
}

// sent publishes -count messages through publish.MessageSender with the
// sent check, and waits until the check has said stored or expired for
// each.
func (h *harness) sent(ctx context.Context) error {
	method := publish.Relay
	if h.cfg.light {
		method = publish.LightPush
	} else if err := h.waitForRelayPeer(ctx); err != nil {
		return err
	}
	sender, err := publish.NewMessageSender(method, publish.NewDefaultPublisher(h.node.Lightpush(), h.node.Relay()), h.log)
	if err != nil {
		return err
	}
	storedCh := make(chan common.Hash, 1000)
	expiredCh := make(chan common.Hash, 1000)
	verifier := &recordingVerifier{inner: publish.NewDefaultStorenodeMessageVerifier(h.node.Store()), rec: h.rec}
	check := publish.NewMessageSentCheck(ctx, verifier, h.cycle, h.node.Timesource(), storedCh, expiredCh, h.log)
	sender.WithMessageSentCheck(check)
	// status-go publishes unthrottled unless UseThrottledPublish is set.
	sender.WithRateLimiting(publish.NewPublishRateLimiter(rate.Inf, 1))
	sender.Start()

	sent := make(map[common.Hash]bool)
	for i := 0; i < h.cfg.count; i++ {
		payload := make([]byte, 32)
		if _, err := rand.Read(payload); err != nil {
			return err
		}
		message := &pb.WakuMessage{
			Payload:      payload,
			ContentTopic: h.cfg.contentTopics[i%len(h.cfg.contentTopics)],
			Timestamp:    proto.Int64(h.node.Timesource().Now().UnixNano()),
		}
		envelope := protocol.NewEnvelope(message, *message.Timestamp, h.cfg.pubsubTopic)
		if err := sender.Send(publish.NewRequest(ctx, envelope)); err != nil {
			return fmt.Errorf("publishing message %d: %w", i, err)
		}
		hash := common.BytesToHash(envelope.Hash().Bytes())
		sent[hash] = true
		h.out.Sent = append(h.out.Sent, hex.EncodeToString(hash.Bytes()))
	}
	for h.out.Stored+h.out.Expired < len(sent) {
		select {
		case hash := <-storedCh:
			if sent[hash] {
				h.out.Stored++
				h.out.Found++
			}
		case hash := <-expiredCh:
			if sent[hash] {
				h.out.Expired++
				h.out.Missing = append(h.out.Missing, hex.EncodeToString(hash.Bytes()))
			}
		case <-ctx.Done():
			return errors.New("timed out before the sent check settled every message")
		}
	}
	return nil
}

func (h *harness) waitForRelayPeer(ctx context.Context) error {
	for !h.node.Relay().EnoughPeersToPublishToTopic(h.cfg.pubsubTopic) {
		select {
		case <-ctx.Done():
			return errors.New("no relay peer on the pubsub topic")
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// history runs the windows on the active storenode, -passes times, each
// pass after the first on the storenode the cycle picks next.
func (h *harness) history(ctx context.Context) error {
	if h.cfg.to <= h.cfg.from {
		return errors.New("-from must be before -to")
	}
	expected := hashSet(h.cfg.expect)
	requestor := &recordingRequestor{inner: missing.NewDefaultStorenodeRequestor(h.node.Store()), rec: h.rec}
	for i := 0; i < h.cfg.passes; i++ {
		if i > 0 {
			previous := h.cycle.GetActiveStorenode()
			h.cycle.Cycle(ctx)
			if err := h.waitForNewStorenode(ctx, previous); err != nil {
				return err
			}
		}
		processor := &historyProcessor{cache: newCache(nil), expected: expected}
		retriever := history.NewHistoryRetriever(requestor, processor, h.log)
		storenode := h.cycle.GetActiveStorenode()
		windows := 0
		// status-go asks newest first, a day at a time, the bounds in
		// whole seconds (its batches carry uint32 seconds).
		for to := h.cfg.to; to > h.cfg.from; to -= int64(historyWindow / time.Second) {
			from := max(to-int64(historyWindow/time.Second), h.cfg.from)
			criteria := store.FilterCriteria{
				ContentFilter: protocol.NewContentFilter(h.cfg.pubsubTopic, h.cfg.contentTopics...),
				TimeStart:     proto.Int64(from * int64(time.Second)),
				TimeEnd:       proto.Int64(to * int64(time.Second)),
			}
			err := h.cycle.PerformStorenodeTask(func() error {
				return retriever.Query(ctx, criteria, storenode, historyPageLimit, nil, true)
			})
			if err != nil {
				return fmt.Errorf("window [%d, %d) on %s: %w", from, to, storenode, err)
			}
			windows++
		}
		found, missingHashes := processor.cache.holds(h.cfg.expect)
		h.out.Passes = append(h.out.Passes, pass{
			Storenode:  storenode.String(),
			Windows:    windows,
			Delivered:  processor.cache.delivered,
			Found:      found,
			Duplicates: processor.cache.duplicates,
		})
		h.out.Found, h.out.Missing = found, missingHashes
		h.out.Fetched, h.out.Duplicates = processor.cache.delivered, processor.cache.duplicates
		h.out.Unexpected = processor.unexpected
	}
	return nil
}

func (h *harness) waitForNewStorenode(ctx context.Context, previous peer.ID) error {
	for {
		current := h.cycle.GetActiveStorenode()
		if current != "" && current != previous && h.cycle.IsStorenodeAvailable(current) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cycle picked no storenode other than %s", previous)
		case <-h.changed:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// historyProcessor is status-go's side of the retriever: every envelope
// goes to the cache; a failed request is an error of the run.
type historyProcessor struct {
	mu         sync.Mutex
	cache      *cache
	expected   map[pb.MessageHash]bool
	unexpected int
}

func (p *historyProcessor) OnEnvelope(envelope *protocol.Envelope, processEnvelopes bool) error {
	p.cache.add(envelope.Hash())
	if !p.expected[envelope.Hash()] {
		p.mu.Lock()
		p.unexpected++
		p.mu.Unlock()
	}
	return nil
}

func (p *historyProcessor) OnRequestFailed(requestID []byte, peerID peer.ID, err error) {
	// The retriever also returns the error, which fails the run.
}

// --- helpers -----------------------------------------------------------------

// newLogger writes go-waku's log to stderr at level, and every entry at
// error level or above, fields included, to errors.
func newLogger(level zapcore.Level, errors *lineBuffer) *zap.Logger {
	encoding := zap.NewProductionEncoderConfig()
	encoding.EncodeTime = zapcore.ISO8601TimeEncoder
	console := zapcore.NewCore(zapcore.NewConsoleEncoder(encoding), zapcore.Lock(os.Stderr), level)
	recorded := zapcore.NewCore(zapcore.NewJSONEncoder(encoding), errors, zapcore.ErrorLevel)
	return zap.New(zapcore.NewTee(console, recorded))
}

// lineBuffer keeps what a zap core writes, one entry a line.
type lineBuffer struct {
	mu      sync.Mutex
	entries []string
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.entries = append(b.entries, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (b *lineBuffer) Sync() error { return nil }

func (b *lineBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string{}, b.entries...)
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
