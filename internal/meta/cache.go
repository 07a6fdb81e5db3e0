package meta

import (
	"context"
	"database/sql"
	"hash/maphash"
	"reflect"

	"github.com/gd2fs/gd2fs/errs"
)

// The session table in the leader's memory (docs/kv-cache.md, "The
// session table in the leader's memory"). A plan or a commit reads a
// session's row, its ranges, its model's layout and the outstanding plans;
// here the leading store keeps what it has read and written of them, so a
// plan or commit reads none of it from SQL. Every change is still written
// to SQL in the same (group) transaction as before, and nobody is answered
// before that transaction commits: the cache is write-through, a crash
// loses nothing acknowledged, and SQL stays the truth every other reader
// (Session, Sessions, the invariants, a new leader) reads.
//
// What keeps the cache equal to SQL:
//
//   - Only the runner of group transactions touches it (one batch at a time
//     per store), and every operation that writes session tables runs as a
//     group operation (plans, commits, forks, deletions, layouts, prefixes).
//   - A batch uses it only when this store leads under the current lead
//     term: Lead increments counters.lead_term when it takes the lead, and
//     each batch reads the term under the sessions lock. A master that lost
//     the lead without noticing yet (its lock's connection dropped) sees a
//     newer term and works from SQL, as before the cache.
//   - A batch that wrote session tables without the cache (a store that does
//     not lead, or one whose term is old) increments counters.sessions_gen
//     in its transaction; a leader whose cache was built under another
//     generation drops it. So no writer anywhere leaves a leader's cache
//     stale.
//   - An operation that fails is rolled back to its savepoint: whatever it
//     loaded or changed in the cache is dropped with it (the journal). A
//     batch whose COMMIT fails drops the whole cache.
//
// With GD2FS_META_INVARIANTS=1 every batch ends by comparing each cached
// entry with SQL (checkCache), so every test of sessions tests the cache.
type sessionCache struct {
	on       bool  // this batch may use the cache
	term     int64 // lead term the cache was built under
	gen      int64 // sessions_gen it was built under
	sessions map[string]*cachedSession
	layouts  map[string]Layout
	// plans holds every outstanding plan when plansLoaded (then a plan or
	// request id not in it is not outstanding); oldest is at most the
	// creation time of the oldest of them (expiry needs no SQL before it).
	plans       map[int64]*cachedPlan
	byRequest   map[string]int64 // session + "\x00" + request id -> plan id
	plansLoaded bool
	oldest      int64
	journal     journal

	// Write-behind (writebehind.go). files: session files and the files
	// their ranges name, with their chunks; total: the bytes reserved in
	// all session files when totalKnown; ids: plan ids persisted ahead
	// (next up to end, exclusive).
	files      map[string]*cachedFile
	total      int64
	totalKnown bool
	ids        struct{ next, end int64 }
	// absentGen counts what could hide from memory a session SQL holds or
	// is about to (a drop of memory, a session shed, a fork made in SQL
	// alone): a plan that read SQL to learn a session is absent makes it
	// in memory only if absentGen did not move meanwhile (planFast).
	// unwritten: sessions made in memory whose log may not be written yet
	// (kept only under a memory cap, where shed may drop them: a plan of
	// one runs in SQL, whose batch writes the log first).
	absentGen int64
	unwritten map[string]*wlog
	// shedIDs: the sessions shed dropped (they are in SQL), so that a plan
	// of one runs in SQL at once instead of first reading SQL to learn it
	// exists (planMem's ask).
	shedIDs idFilter
	// idsWanted: the ids a plan sent to SQL for want of them needed (one,
	// and one a chunk it allocates); the slow path then takes a new block.
	idsWanted int64
	// owned: the paths of the files each session owns (cachedFile.owner)
	// as they were loaded, so shed drops them with their session. Paths
	// dropped otherwise may linger here until their session goes.
	owned map[string][]string
}

// cachedSession is a session's row and ranges as in SQL.
type cachedSession struct {
	row      sessionRow
	ranges   []Range
	lastPlan int64
	forkReq  string
	// lastUsed and created (Unix ns) and bytes (reserved in the files the
	// session owns): what a commit answered from memory reports. lastUsed
	// counts the outstanding plans' creation (lastUsedCol).
	lastUsed, created, bytes int64
}

// cachedPlan is a kv_plans row.
type cachedPlan struct {
	session   string
	fr        Range
	base      int64
	hashFrom  int64
	hashes    string
	planned   int64
	split     int64
	requestID string
	answer    string
	created   int64
}

// journal is what the running operation put into the cache, dropped if it
// fails.
type journal struct {
	sessions []string
	layouts  []string
	plans    bool
	files    []string
	ids      bool
}

func (c *sessionCache) reset() {
	c.sessions = map[string]*cachedSession{}
	c.layouts = map[string]Layout{}
	c.files = map[string]*cachedFile{}
	c.owned = map[string][]string{}
	c.unwritten = map[string]*wlog{}
	c.absentGen++
	c.totalKnown = false
	c.ids.next, c.ids.end = 0, 0
	c.dropPlans()
}

func (c *sessionCache) dropPlans() {
	c.plans = map[int64]*cachedPlan{}
	c.byRequest = map[string]int64{}
	c.plansLoaded = false
	c.oldest = 0
}

// beginBatch decides, inside the batch's transaction, under the sessions
// lock and with wb.mu held, whether the batch uses the cache; term and gen
// are the counters read in the transaction. Memory dropped here takes the
// write-behind log built on it along (writebehind.go), and a leader that
// lost such a log takes a new lead term before memory answers again.
func (s *sqlStore) beginBatch(ctx context.Context, tx *sql.Tx, term, gen int64) error {
	c := &s.cache
	mine := s.leadTerm.Load()
	c.on = mine > 0 && mine == term
	if !c.on || c.term != term || c.gen != gen || c.sessions == nil {
		c.reset()
		s.discard()
		c.term, c.gen = term, gen
	}
	if c.on && s.wb.bump {
		// Bytes answered from memory and lost may be written yet: no file
		// reserved in under the old term is appended to again. The batch's
		// operations use the new term; the store takes it (and memory may
		// answer again) only once the batch commits (runBatch): a batch
		// that fails leaves SQL at the old term, and a store ahead of SQL
		// would share its next term with the next leader.
		if err := tx.QueryRowContext(ctx, `UPDATE counters SET v = v + 1 WHERE k = 'lead_term' RETURNING v`).Scan(&term); err != nil {
			return wrapDB(err)
		}
		c.reset()
		c.term = term
		s.wb.newTerm = term
	}
	c.journal = journal{}
	return nil
}

// termGenQuery reads the lead term and the sessions generation, which a
// batch compares with memory's (beginBatch, checkCache).
const termGenQuery = `SELECT (SELECT v FROM counters WHERE k = 'lead_term'), (SELECT v FROM counters WHERE k = 'sessions_gen')`

// endBatch runs after the batch's operations, before COMMIT: a batch that
// wrote session tables without the cache tells every cache so.
func (s *sqlStore) endBatch(ctx context.Context, tx *sql.Tx, wrote bool) error {
	if s.cache.on || !wrote {
		return nil
	}
	_, err := tx.ExecContext(ctx, `UPDATE counters SET v = v + 1 WHERE k = 'sessions_gen'`)
	return wrapDB(err)
}

// opFailed drops what a failed operation put into the cache (SQL rolled
// it back to the operation's savepoint).
func (s *sqlStore) opFailed() {
	c := &s.cache
	for _, id := range c.journal.sessions {
		c.unload(id)
	}
	for _, m := range c.journal.layouts {
		delete(c.layouts, m)
	}
	if c.journal.plans {
		c.dropPlans()
	}
	for _, p := range c.journal.files {
		delete(c.files, p)
	}
	if c.journal.ids {
		c.ids.next, c.ids.end = 0, 0
	}
	// A failed operation may have changed reservations before failing.
	c.totalKnown = false
	c.journal = journal{}
}

// touchSession records that the running operation changes session id's
// cache entry (or loads it).
func (c *sessionCache) touchSession(id string) { c.journal.sessions = append(c.journal.sessions, id) }

// unload drops session id's entry from memory. Whatever the reason, SQL
// may hold the session still (or again, after a rollback): absentGen moves,
// so a plan that read SQL before does not take it for absent (planFast).
func (c *sessionCache) unload(id string) {
	delete(c.sessions, id)
	c.absentGen++
}

// dropSession forgets session id and its plans.
func (c *sessionCache) dropSession(id string) {
	if !c.on {
		return
	}
	c.touchSession(id)
	c.unload(id)
	delete(c.owned, id)
	c.journal.plans = true
	for pid, p := range c.plans {
		if p.session == id {
			c.removePlan(pid)
		}
	}
}

func (c *sessionCache) removePlan(id int64) {
	c.journal.plans = true
	if p, ok := c.plans[id]; ok {
		if p.requestID != "" {
			delete(c.byRequest, p.session+"\x00"+p.requestID)
		}
		delete(c.plans, id)
	}
}

func (c *sessionCache) addPlan(id int64, p *cachedPlan) {
	c.journal.plans = true
	if !c.plansLoaded {
		return
	}
	c.plans[id] = p
	if p.requestID != "" {
		c.byRequest[p.session+"\x00"+p.requestID] = id
	}
	if len(c.plans) == 1 || p.created < c.oldest {
		c.oldest = p.created
	}
}

// layoutC is layoutTx through the cache.
func (s *sqlStore) layoutC(ctx context.Context, tx *sql.Tx, model string) (Layout, error) {
	c := &s.cache
	if c.on {
		if l, ok := c.layouts[model]; ok {
			c.journal.layouts = append(c.journal.layouts, model)
			return l, nil
		}
	}
	l, err := s.layoutTx(ctx, tx, model)
	if err == nil && c.on {
		c.journal.layouts = append(c.journal.layouts, model)
		c.layouts[model] = l
	}
	return l, err
}

// sessionC is a session's row and ranges through the cache; the entry is
// the cache's own (change it only with touchSession first), or a fresh one
// when the cache is off. ok is false when there is no such session.
func (s *sqlStore) sessionC(ctx context.Context, tx *sql.Tx, id string) (*cachedSession, bool, error) {
	c := &s.cache
	if c.on {
		if e, ok := c.sessions[id]; ok {
			c.touchSession(id) // an operation that fails forgets what it read
			return e, true, nil
		}
	}
	e, ok, err := s.loadSession(ctx, tx, id)
	if err != nil || !ok {
		return nil, ok, err
	}
	if c.on {
		c.touchSession(id)
		c.sessions[id] = e
	}
	return e, true, nil
}

func (s *sqlStore) loadSession(ctx context.Context, x execer, id string) (*cachedSession, bool, error) {
	row, ok, err := s.sessionTx(ctx, x, id)
	if err != nil || !ok {
		return nil, ok, err
	}
	e := &cachedSession{row: row}
	var planUsed int64
	if err := x.QueryRowContext(ctx, s.q(`SELECT last_plan, fork_request, last_used, `+lastUsedCol+`, created,
		(SELECT COALESCE(SUM(reserved), 0) FROM kv_files WHERE session_id = kv_sessions.id) FROM kv_sessions WHERE id = ?`), id).
		Scan(&e.lastPlan, &e.forkReq, &e.lastUsed, &planUsed, &e.created, &e.bytes); err != nil {
		return nil, false, wrapDB(err)
	}
	e.lastUsed = max(e.lastUsed, planUsed)
	if e.ranges, err = s.rangesTx(ctx, x, id); err != nil {
		return nil, false, err
	}
	return e, true, nil
}

// putSession records session id's new entry (the operation wrote it to SQL).
func (c *sessionCache) putSession(id string, e *cachedSession) {
	if !c.on {
		return
	}
	c.touchSession(id)
	c.sessions[id] = e
}

// loadPlans fills the cache with every outstanding plan, once per cache.
func (s *sqlStore) loadPlans(ctx context.Context, tx *sql.Tx) error {
	c := &s.cache
	if !c.on || c.plansLoaded {
		return nil
	}
	ps, err := s.allPlans(ctx, tx)
	if err != nil {
		return err
	}
	c.journal.plans = true
	c.plansLoaded = true
	for id, p := range ps {
		c.addPlan(id, p)
	}
	return nil
}

func (s *sqlStore) allPlans(ctx context.Context, x execer) (map[int64]*cachedPlan, error) {
	rows, err := x.QueryContext(ctx, `SELECT id, session_id, token_start, token_length, path, kv_start, kv_length, base_version, hash_from, hashes,
		planned_tokens, split_at, request_id, answer, created FROM kv_plans`)
	if err != nil {
		return nil, wrapDB(err)
	}
	defer rows.Close()
	out := map[int64]*cachedPlan{}
	for rows.Next() {
		var id int64
		p := &cachedPlan{}
		if err := rows.Scan(&id, &p.session, &p.fr.TokenStart, &p.fr.TokenLength, &p.fr.Path, &p.fr.KVStart, &p.fr.KVLength, &p.base, &p.hashFrom, &p.hashes,
			&p.planned, &p.split, &p.requestID, &p.answer, &p.created); err != nil {
			return nil, wrapDB(err)
		}
		out[id] = p
	}
	return out, wrapDB(rows.Err())
}

// checkCache compares every cached entry with SQL (GD2FS_META_INVARIANTS=1),
// after a batch committed.
func (s *sqlStore) checkCache(ctx context.Context) error {
	c := &s.cache
	if !c.on {
		return nil
	}
	// One snapshot (as checkInvariants), and only while SQL is still at the
	// term and generation memory was built under: a master that does not
	// lead (a stale leader, from SQL) may have written since this batch's
	// COMMIT, and this leader then drops its memory at its next batch.
	tx, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var term, gen int64
	if err := tx.QueryRowContext(ctx, termGenQuery).Scan(&term, &gen); err != nil {
		return wrapDB(err)
	}
	if term != c.term || gen != c.gen {
		return nil
	}
	for id, e := range c.sessions {
		got, ok, err := s.loadSession(ctx, tx, id)
		if err != nil {
			return err
		}
		if !ok {
			return errs.New(errs.ErrInternal, "session cache holds session %s, which SQL does not", id)
		}
		if !reflect.DeepEqual(normal(got), normal(e)) {
			return errs.New(errs.ErrInternal, "session cache differs from SQL for %s:\ncache %+v\nsql   %+v", id, *e, *got)
		}
	}
	for m, l := range c.layouts {
		got, err := s.layoutTx(ctx, tx, m)
		if err != nil || got != l {
			return errs.New(errs.ErrInternal, "layout cache differs from SQL for %s: %+v, %+v %v", m, l, got, err)
		}
	}
	if err := s.checkFiles(ctx, tx); err != nil { // writebehind.go
		return err
	}
	if err := s.checkIDs(ctx, tx); err != nil { // writebehind.go
		return err
	}
	if c.plansLoaded {
		ps, err := s.allPlans(ctx, tx)
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(ps, c.plans) {
			return errs.New(errs.ErrInternal, "plan cache differs from SQL: %d plans cached, %d in SQL", len(c.plans), len(ps))
		}
		for id, p := range ps {
			if p.created < c.oldest {
				return errs.New(errs.ErrInternal, "plan %d created at %d, before the cache's oldest %d", id, p.created, c.oldest)
			}
			if p.requestID != "" && c.byRequest[p.session+"\x00"+p.requestID] != id {
				return errs.New(errs.ErrInternal, "plan %d's request %q not indexed", id, p.requestID)
			}
		}
		if len(c.byRequest) > len(ps) {
			return errs.New(errs.ErrInternal, "request index has %d entries for %d plans", len(c.byRequest), len(ps))
		}
	}
	return nil
}

// normal makes nil and empty slices compare equal.
func normal(e *cachedSession) cachedSession {
	x := *e
	if len(x.ranges) == 0 {
		x.ranges = nil
	}
	if len(x.row.hashes) == 0 {
		x.row.hashes = nil
	}
	return x
}

// SessionMemorySetter is implemented by stores whose leader keeps sessions
// in memory.
type SessionMemorySetter interface {
	// SetSessionMemory bounds the bytes of sessions the leader keeps in
	// memory (0: no bound); call it before the store is used.
	SetSessionMemory(bytes int64) error
}

// SetSessionMemory bounds the leader's memory of sessions (docs/kv-cache.md,
// "The leader's memory and its cap").
func (s *sqlStore) SetSessionMemory(bytes int64) error {
	if bytes < 0 {
		return errs.New(errs.ErrBadRequest, "session memory of %d bytes: give a size such as 2GiB, or 0 for no bound", bytes)
	}
	s.memCap = bytes
	return nil
}

// shedSample is how many entries shed looks at to pick each one it drops
// (the least recently used of them), as Redis's approximated LRU does.
const shedSample = 16

// Sizes shed counts (heap bytes, measured: docs/kv-cache.md): an entry's
// fixed part and its map slot, a range's, and a file the session owns, its
// fixed part and each chunk it holds (chunkSet).
const (
	entryBytes = 512
	rangeBytes = 96
	fileBytes  = 128
	chunkBytes = 64
)

// size estimates the heap an entry holds, its owned files included.
func (c *sessionCache) size(id string, e *cachedSession) int64 {
	n := int64(entryBytes + len(id) + 16*len(e.row.hashes))
	for _, p := range c.owned[id] {
		n += fileBytes
		if f := c.files[p]; f != nil {
			n += chunkBytes * int64(len(f.chunks))
		}
	}
	for _, r := range e.ranges {
		n += rangeBytes + int64(len(r.Path))
	}
	return n
}

// shed drops sessions from memory, the least recently used first (sampled),
// once their estimated size passes limit: down to 15/16 of it, so that not
// every batch sheds. Memory only: SQL holds every one of them (the cache is
// written through, and a window-mode log is written before any operation
// that loads an entry again), and a plan or commit of a dropped session
// runs in SQL, which loads it back (SlowNotInMemory), as on a new leader.
// A session made in memory whose log is not written yet (unwritten) is
// not in SQL: its next plan runs in SQL without asking whether it exists.
// Outstanding plans stay (memory must hold all of them). It returns how
// many it dropped. Called with wb.mu held, after a batch's COMMIT: entries
// are loaded by batches and made by plans answered from memory, whose
// logs batches write (written: the log this batch wrote).
func (c *sessionCache) shed(limit int64, written *wlog) int {
	for id, lg := range c.unwritten {
		if lg == written {
			delete(c.unwritten, id)
			continue
		}
		select {
		case <-lg.done:
			delete(c.unwritten, id)
		default:
		}
	}
	if limit <= 0 || len(c.sessions) == 0 {
		return 0
	}
	var sum int64
	k := 0
	for id, e := range c.sessions {
		sum += c.size(id, e)
		if k++; k == 4*shedSample {
			break
		}
	}
	avg := max(1, sum/int64(k))
	if int64(len(c.sessions))*avg <= limit {
		return 0
	}
	// At least one stays (the last picked is the most recently used of
	// those left): a cap below one session would otherwise drop the
	// session each of its operations just loaded, every time.
	keep := max(1, int(limit/16*15/avg))
	dropped := 0
	for len(c.sessions) > keep {
		victim, oldest, n := "", int64(0), 0
		for id, e := range c.sessions {
			if victim == "" || e.lastUsed < oldest {
				victim, oldest = id, e.lastUsed
			}
			if n++; n == shedSample {
				break
			}
		}
		c.unload(victim)
		c.shedIDs.add(victim)
		for _, p := range c.owned[victim] {
			if f := c.files[p]; f != nil && f.owner == victim {
				delete(c.files, p)
			}
		}
		delete(c.owned, victim)
		dropped++
	}
	// Files whose owner memory no longer holds (a fork's ranges loaded its
	// parent's file, or the owner was dropped by an eviction run elsewhere)
	// go too, else they would outlive every cap; a plan that needs one
	// loads it again.
	for owner, paths := range c.owned {
		if _, ok := c.sessions[owner]; ok {
			continue
		}
		for _, p := range paths {
			if f := c.files[p]; f != nil && f.owner == owner {
				delete(c.files, p)
			}
		}
		delete(c.owned, owner)
	}
	return dropped
}

// idFilter is a Bloom filter of session ids (4 probes in 2^20 bits, ~1 %
// false positives at its capacity). It only answers "maybe" or "no", and
// a full one starts again empty: what it forgot costs a read of SQL.
type idFilter struct {
	bits []uint64
	n    int
	seed maphash.Seed
}

const (
	idFilterBits = 1 << 20
	idFilterCap  = 100_000
)

func (f *idFilter) probes(id string, fn func(bit uint32)) {
	h := maphash.String(f.seed, id)
	h1, h2 := uint32(h), uint32(h>>32)|1
	for i := range uint32(4) {
		fn((h1 + i*h2) % idFilterBits)
	}
}

func (f *idFilter) add(id string) {
	if f.bits == nil {
		f.bits, f.seed = make([]uint64, idFilterBits/64), maphash.MakeSeed()
	}
	if f.n >= idFilterCap {
		clear(f.bits)
		f.n = 0
	}
	f.probes(id, func(b uint32) { f.bits[b/64] |= 1 << (b % 64) })
	f.n++
}

func (f *idFilter) has(id string) bool {
	if f.bits == nil {
		return false
	}
	all := true
	f.probes(id, func(b uint32) { all = all && f.bits[b/64]&(1<<(b%64)) != 0 })
	return all
}
