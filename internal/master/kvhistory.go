package master

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/placement"
)

// savedKVHistory is kvHistory as the metadata store keeps it (JSON in
// cluster_info; meta.SaveKVHistory).
type savedKVHistory struct {
	Last      []placement.Member `json:"last"`
	LastEpoch int64              `json:"last_epoch"`
	Prev      []api.PastMembers  `json:"prev"`
	Draining  []string           `json:"draining"`
}

// saveKVHistory writes the KV membership history to the metadata store if
// it changed since the last save. Saves are serialised so that an older
// snapshot never overwrites a newer one.
func (m *Master) saveKVHistory(ctx context.Context) error {
	if !m.leader.Load() {
		return nil // a standby's history is not the cluster's; the leader's is loaded on taking over
	}
	m.kvSaveMu.Lock()
	defer m.kvSaveMu.Unlock()
	m.mu.Lock()
	h := &m.kvHist
	if h.seq == h.savedSeq {
		m.mu.Unlock()
		return nil
	}
	seq := h.seq
	doc := savedKVHistory{Last: slices.Clone(h.last), LastEpoch: h.lastEpoch, Prev: slices.Clone(h.prev)}
	for id := range h.draining {
		doc.Draining = append(doc.Draining, id)
	}
	m.mu.Unlock()
	slices.Sort(doc.Draining)
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	if err := m.meta.SaveKVHistory(ctx, b); err != nil {
		return fmt.Errorf("save the KV membership history: %w", err)
	}
	m.mu.Lock()
	h.savedSeq = max(h.savedSeq, seq)
	m.mu.Unlock()
	return nil
}

// kvSaver saves the KV membership history in the background after a
// heartbeat or a members request computed a new member list, and bumps the
// epoch when a new list is held back for a bump that did not land
// (kvHistory.note): the save is a
// metadata write, and heartbeats waiting on it under load would make
// servers look down, change the list again and ask for another save. A
// master that dies between handing out a list and saving it loses that one
// list from the history (the blocks still moving from it are then found by
// read-through only until the next change). Drains are saved before they
// are answered (drainRoute).
type kvSaver struct {
	mu      sync.Mutex
	kickc   chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
}

// kick asks for a save and returns at once; the first kick starts the
// saver.
func (k *kvSaver) kick(m *Master) {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	if k.kickc == nil {
		k.kickc = make(chan struct{}, 1)
		k.done = make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		k.cancel = cancel
		go k.run(ctx, m)
	}
	k.mu.Unlock()
	select {
	case k.kickc <- struct{}{}:
	default: // a save is already due: it will write the newest history
	}
}

func (k *kvSaver) run(ctx context.Context, m *Master) {
	defer close(k.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.kickc:
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := m.saveKVHistory(sctx); err != nil && ctx.Err() == nil {
			m.log.Warn("saving the KV membership history failed; retried at the next change or heartbeat", "err", err)
		}
		// A new list held back for its epoch bump (kvHistory.note), and the
		// bump has not landed: make it here, after the save (the order a
		// drain keeps). A bump that fails is tried again at the next kick
		// (heartbeat or members request) while the list is still held.
		m.mu.Lock()
		owed := m.kvHist.held && m.epoch <= m.kvHist.lastEpoch
		m.mu.Unlock()
		if owed && m.leader.Load() && ctx.Err() == nil { // not while stopping
			m.bumpEpoch(sctx)
		}
		cancel()
	}
}

// stop ends the saver and waits for it.
func (k *kvSaver) stop() {
	k.mu.Lock()
	k.stopped = true
	cancel, done := k.cancel, k.done
	k.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// loadKVHistory replaces the KV membership history with the saved one; a
// master calls it when it takes the lead. A damaged document is logged and
// ignored: moves in progress then finish through read-through only, as
// before the history was saved.
func (m *Master) loadKVHistory(ctx context.Context) error {
	b, err := m.meta.KVHistory(ctx)
	if err != nil || b == nil {
		return err
	}
	var doc savedKVHistory
	if err := json.Unmarshal(b, &doc); err != nil {
		m.log.Warn("the saved KV membership history is unreadable; starting a new one", "err", err)
		return nil
	}
	doc.Prev = trimPast(doc.Prev, func(id string) bool { return slices.Contains(doc.Draining, id) })
	m.mu.Lock()
	defer m.mu.Unlock()
	h := &m.kvHist
	h.last, h.lastEpoch, h.prev = doc.Last, doc.LastEpoch, doc.Prev
	h.draining = map[string]bool{}
	for _, id := range doc.Draining {
		h.draining[id] = true
	}
	h.savedSeq = h.seq
	return nil
}
