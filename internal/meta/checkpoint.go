package meta

import (
	"context"
	"database/sql"
	"sync"
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
// ckptEvery after a group commit wrote; the writer's own autocheckpoint
// stays as the bound should these fall behind (sqliteCachePragmas).

// ckptEvery is the least time between two background checkpoints: often
// enough that the WAL stays below the writer's own threshold (64 MiB) at
// any rate this machine reaches (about 75 MiB of WAL a second at 1,000
// turns/s on 100,000 sessions), rarely enough that a page flushes rewrite
// every few milliseconds is copied once a second, not at each flush: at
// 250 ms the copies and syncs competing with the writer raised the flush
// time by half and a plan's p50 from 0.9 to 2.1 ms. A variable for tests.
var ckptEvery = time.Second

type checkpointer struct {
	dsn  string
	kick chan struct{}
	once sync.Once // starts the loop at the first kick
	stop context.CancelFunc
	ctx  context.Context
	done chan struct{}
	// runs counts the checkpoints made (tests); err is the last one's.
	mu   sync.Mutex
	runs int
	err  error
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
		_, err := db.ExecContext(c.ctx, `PRAGMA wal_checkpoint(PASSIVE)`)
		c.record(err)
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(ckptEvery):
		}
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
