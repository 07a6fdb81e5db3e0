package master

import (
	"net/http"
	"slices"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/placement"
)

// kvHistory remembers the member lists before the current one and the
// servers being drained, so that servers can find a block whose owner moved
// on its owner under an earlier list (and move it) instead of answering a
// miss: adding a server must not empty the KV cache. Guarded by Master.mu;
// saved in the metadata store on every change and loaded by a master that
// takes the lead (kvhistory.go), so a restart does not forget a drain or the
// earlier owners of blocks still moving.
type kvHistory struct {
	last      []placement.Member
	lastEpoch int64
	prev      []api.PastMembers // newest first, keepPast and draining servers' (trimPast)
	draining  map[string]bool
	seq       int64 // bumped on every change worth saving
	savedSeq  int64 // the seq the store holds
	// held: the last map computed showed h.last in place of a new list
	// (note). The epoch bump that shows the new list is owed; the saver
	// makes it if it has not landed (kvSaver.run).
	held bool
}

// keepPast is how many earlier member lists a membership map carries: two
// changes in quick succession (a server replaced) still find every block.
// A draining server's last list is kept past those (trimPast).
const keepPast = 2

// trimPast cuts prev (newest first) to its keepPast newest lists, and keeps
// besides, for each server that draining reports, the newest list that
// names it when no kept list does. That list is the only way to a drained
// server's blocks: new owners find and move the blocks of the earlier
// owners under the lists the map carries (server/kvmove.go). Dropped, the
// drain never ends and its blocks are misses until then; two more changes
// of the list during a long drain (a server restarted, or servers that miss
// heartbeats under load and come back) dropped it (TestKVDrain timed out so,
// TestKVDrainOutlivesListChanges). The list goes at the first change after
// the drain ends or is taken back.
func trimPast(prev []api.PastMembers, draining func(id string) bool) []api.PastMembers {
	if len(prev) <= keepPast {
		return prev
	}
	kept := slices.Clone(prev[:keepPast])
	named := map[string]bool{}
	for _, p := range kept {
		for _, m := range p.Members {
			named[m.ID] = true
		}
	}
	for _, p := range prev[keepPast:] {
		if !slices.ContainsFunc(p.Members, func(m placement.Member) bool { return draining(m.ID) && !named[m.ID] }) {
			continue
		}
		kept = append(kept, p)
		for _, m := range p.Members {
			named[m.ID] = true
		}
	}
	return kept
}

// note records out's member list (when it differs from the last one seen)
// and fills in out.Previous and out.Draining. Called with Master.mu held.
//
// A new list is shown only under a newer epoch than the last list's. Every
// change of the list is followed by an epoch bump, but after a store write
// (a drain saves the history first; a join writes the server first) that a
// slow store makes long: meanwhile the last list is shown at its epoch.
// Servers learn that the map changed by comparing epochs (a peer moving a
// block away asks with its epoch, kvCatchUp); a new list under an old epoch
// left the old owner serving the key, and answering a miss for a block the
// new owner had moved away (TestMemberListChangesWithEpoch; found by
// TestKVMembershipUnderLoad beside a busy disk).
//
// The bump is owed by whoever changed the list, and it can fail (a store
// error, or the request's context cancelled by a caller that gave up on a
// slow store) or never come (a join whose server write failed is not new at
// its next heartbeat; a drain repeated after a failed save is no change):
// the new list would then be held back until some other change. So a held
// list is marked, and the saver bumps the epoch itself (kvSaver.run,
// TestHeldMemberListIsShownAfterAFailedBump).
func (h *kvHistory) note(out *api.Membership, servers map[string]*liveServer) {
	h.held = false
	if !slices.Equal(h.last, out.Members) && h.last != nil && out.Epoch <= h.lastEpoch {
		out.Members = slices.Clone(h.last)
		h.held = true
	}
	if !slices.Equal(h.last, out.Members) {
		if h.last != nil {
			h.prev = trimPast(append([]api.PastMembers{{Epoch: h.lastEpoch, Members: h.last}}, h.prev...), func(id string) bool {
				// A drain not done: the server's last report (or a new
				// leader's presumption) says it holds blocks. Up or not: one
				// that missed heartbeats for a second comes back with them.
				s := servers[id]
				return h.draining[id] && s != nil && (s.presumed || s.info.KV != nil && s.info.KV.Keys > 0)
			})
		}
		h.last = slices.Clone(out.Members)
		h.seq++
	}
	h.lastEpoch = out.Epoch
	out.Previous = slices.Clone(h.prev)
	for id := range h.draining {
		// presumed: a new leader has not heard from it yet (it was draining
		// under the last one); its blocks are still there to be moved.
		if s := servers[id]; s != nil && (s.up || s.presumed) && !slices.ContainsFunc(out.Members, func(m placement.Member) bool { return m.ID == id }) {
			out.Draining = append(out.Draining, placement.Member{ID: id, Addr: s.info.Addr})
		}
	}
	slices.SortFunc(out.Draining, func(a, b placement.Member) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
}

// drainRoute serves POST /v1/servers/{id}/drain (?undo=1 takes it back):
// the server leaves the membership map, so its KV blocks' owners become
// other servers, which move them there; it keeps serving them meanwhile.
// gd2fs server drain waits until it holds no blocks.
func (m *Master) drainRoute(r *http.Request) (any, error) {
	id := r.PathValue("id")
	undo := r.URL.Query().Get("undo") != ""
	m.mu.Lock()
	s := m.servers[id]
	if s == nil {
		m.mu.Unlock()
		return nil, errs.New(errs.ErrNotFound, "no server %q: gd2fs status lists the servers", id)
	}
	if m.kvHist.draining == nil {
		m.kvHist.draining = map[string]bool{}
	}
	changed := m.kvHist.draining[id] == undo
	if undo {
		delete(m.kvHist.draining, id)
	} else {
		m.kvHist.draining[id] = true
	}
	if changed {
		m.kvHist.seq++
	}
	info := s.info
	m.mu.Unlock()
	if changed {
		// Saved before the answer: a drain the caller was told of survives
		// a master restart (kvhistory.go).
		if err := m.saveKVHistory(r.Context()); err != nil {
			return nil, err
		}
		if undo {
			m.log.Info("server drain taken back", "id", id)
		} else {
			m.log.Info("server draining: its KV blocks move to their next owners", "id", id)
		}
		m.bumpEpoch(r.Context())
	}
	info.State = drainState(info.State, !undo)
	return info, nil
}

func drainState(state string, draining bool) string {
	if draining && state == "up" {
		return "draining"
	}
	return state
}
