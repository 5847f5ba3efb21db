package main

import (
	"context"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	apicommon "github.com/waku-org/go-waku/waku/v2/api/common"
	"github.com/waku-org/go-waku/waku/v2/api/publish"
	"github.com/waku-org/go-waku/waku/v2/protocol/pb"
	"github.com/waku-org/go-waku/waku/v2/protocol/store"
	storepb "github.com/waku-org/go-waku/waku/v2/protocol/store/pb"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/proto"
)

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
