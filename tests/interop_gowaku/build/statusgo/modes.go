package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/waku-org/go-waku/waku/v2/api/history"
	"github.com/waku-org/go-waku/waku/v2/api/missing"
	"github.com/waku-org/go-waku/waku/v2/api/publish"
	"github.com/waku-org/go-waku/waku/v2/protocol"
	"github.com/waku-org/go-waku/waku/v2/protocol/pb"
	"github.com/waku-org/go-waku/waku/v2/protocol/store"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
)

// --- the modes ----------------------------------------------------------------

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
