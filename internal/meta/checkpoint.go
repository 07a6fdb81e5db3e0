package meta

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"time"
)

// SQLite's WAL checkpoints, beside the writer (docs/kv-cache.md, "What a
// flush costs"). A checkpoint copies the pages the WAL holds back into the
// database file and syncs it. Left to SQLite (wal_autocheckpoint), it runs
// inside the commit that crosses the threshold: that flush, and everything
// waiting for it, stalls for the copy — at 1,000 turns/s on 100,000
// sessions a plan's p99 was 90–110 ms in window mode, 27 ms with no
// checkpoint in the run. Here a connection of its own runs a PASSIVE
// checkpoint (it never waits for, nor blocks, the writer) at most every
// ckptEvery after a group commit wrote.
//
// A PASSIVE checkpoint copies the frames the WAL held when it began; the
// WAL starts again from its head only when a write finds every frame
// copied, which never happens while the leader writes on: the WAL grew to
// the writer's own bound and the checkpoint ran inside a commit after all,
// with every frame written since the last background pass to copy (150–220
// ms flushes at 2,000 turns/s on 100,000 sessions, about 120 MiB of WAL a
// second). So the background pass runs again while the WAL grew by more
// than ckptTail frames since the pass before, each pass shorter than the
// last, and then asks the writer to copy the few left between two of its
// transactions (finishTail): the next write starts the WAL again. (A
// reader of an older snapshot on another connection, as a standby's,
// stops both the copy and the new start; the round then asks nothing.)
// The WAL file keeps the largest size it reached (no journal_size_limit).
// The writer's own autocheckpoint stays, far above, as the bound should
// all this fall behind (sqliteCachePragmas).

// ckptEvery is the least time between two background checkpoints: rarely
// enough that a page flushes rewrite every few milliseconds is copied once
// a second, not at each flush: at 250 ms the copies and syncs competing
// with the writer raised the flush time by half and a plan's p50 from 0.9
// to 2.1 ms. A variable for tests.
var ckptEvery = time.Second

// ckptTail: a background pass that found the WAL grown by at most this
// many frames since the pass before is the round's last, and what the
// writer wrote during it (about as many) is left to the writer
// (finishTail): 1,024 frames are 4 MiB. ckptPasses bounds the passes of a
// round.
const (
	ckptTail   = 1024
	ckptPasses = 4
)

type checkpointer struct {
	dsn  string
	kick chan struct{}
	once sync.Once // starts the loop at the first kick
	stop context.CancelFunc
	ctx  context.Context
	done chan struct{}
	// tail: a background round left at most ckptTail frames, which the
	// writer copies (finishTail).
	tail atomic.Bool
	// runs counts the checkpoints made (tests); err is the last one's;
	// tails counts the writer's.
	mu    sync.Mutex
	runs  int
	tails int
	err   error
}

func newCheckpointer(dsn string) *checkpointer {
	ctx, stop := context.WithCancel(context.Background())
	return &checkpointer{dsn: dsn, kick: make(chan struct{}, 1), ctx: ctx, stop: stop, done: make(chan struct{})}
}

// wrote tells the checkpointer a transaction committed pages to the WAL.
func (c *checkpointer) wrote() {
	if c == nil {
		return
	}
	c.once.Do(func() { go c.loop() })
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *checkpointer) loop() {
	defer close(c.done)
	db, err := sql.Open("sqlite", c.dsn)
	if err != nil {
		c.record(err)
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
		}
		c.round(db)
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(ckptEvery):
		}
	}
}

// round runs the passes of one background round on db. Each pass copies
// what the writer wrote during the one before: fewer frames, a shorter
// pass. The writer is asked to copy the rest (finishTail) only after a
// pass that copied every frame it found, when the WAL grew by at most
// ckptTail frames since the pass before (what the writer wrote during
// this one is then about as few). A pass that copied less than it found
// (another connection reads an older snapshot: a standby reading the same
// file) or found the checkpoint lock taken (busy) ends the round without
// asking: the writer must never be handed a backlog. A WAL that shrank
// was started again by the writer: nothing is left to ask for.
func (c *checkpointer) round(db *sql.DB) {
	var before walState
	for pass := 1; pass <= ckptPasses; pass++ {
		now, err := walCheckpoint(c.ctx, db)
		c.record(err)
		if err != nil || now.busy || now.frames < before.frames || now.copied < now.frames {
			return
		}
		if now.frames-before.frames <= ckptTail {
			c.tail.Store(true)
			return
		}
		before = now
	}
}

// walState is what a checkpoint found: the frames in the WAL when it
// began and how many of them are copied into the database file (since the
// WAL last started again), or busy: another checkpoint held the lock, and
// the counts are unknown.
type walState struct {
	busy           bool
	frames, copied int64
}

// walCheckpoint runs a PASSIVE checkpoint on db.
func walCheckpoint(ctx context.Context, db *sql.DB) (walState, error) {
	var busy int64
	var w walState
	err := db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &w.frames, &w.copied)
	w.busy = busy != 0 || w.frames < 0 || w.copied < 0
	return w, err
}

// finishTail copies, on the writer's connection db and between two of its
// transactions, the frames the last background round left, so that the
// next write starts the WAL again from its head. It runs only when such a
// round asked; a failure is recorded and left to the next round.
func (c *checkpointer) finishTail(db *sql.DB) {
	if c == nil || !c.tail.CompareAndSwap(true, false) {
		return
	}
	w, err := walCheckpoint(c.ctx, db)
	if err == nil && w.busy {
		c.tail.Store(true) // the background round holds the lock: next time
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tails++
	if err != nil && c.ctx.Err() == nil {
		c.err = err
	}
}

func (c *checkpointer) record(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs++
	c.err = err
}

// close stops the loop (at once: it waits for no timer) and its connection.
func (c *checkpointer) close() {
	if c == nil {
		return
	}
	c.stop()
	c.once.Do(func() { close(c.done) }) // never started: nothing to wait for
	<-c.done
}
