package master

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

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
	if len(doc.Prev) > keepPast {
		doc.Prev = doc.Prev[:keepPast]
	}
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
