package meta

import (
	"context"
	"database/sql"
	"encoding/binary"
	"os"
	"testing"
	"time"
)

// TestCheckpointerBesideWriter: a SQLite store's group commits start the
// background checkpointer, which checkpoints on its own connection without
// error; Close stops it at once, not after its pause (an hour here: a
// Close that waited would hang the test).
func TestCheckpointerBesideWriter(t *testing.T) {
	old := ckptEvery
	ckptEvery = time.Hour
	defer func() { ckptEvery = old }()
	s := leading(t, sqliteForTest(t)).(*sqlStore)
	if s.ckpt == nil {
		t.Fatal("a SQLite store has no checkpointer")
	}
	ctx := context.Background()
	for i := range 3 {
		l := wbLayout
		l.Model = string(rune('a' + i))
		if err := s.PutLayout(ctx, l); err != nil { // a group commit
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s.ckpt.mu.Lock()
		runs, err := s.ckpt.runs, s.ckpt.err
		s.ckpt.mu.Unlock()
		if err != nil {
			t.Fatalf("background checkpoint: %v", err)
		}
		if runs > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no background checkpoint after the group commits")
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Layout(ctx, "a"); err == nil {
		t.Fatal("a closed store answered")
	}
}

// TestCheckpointTailByWriter: a background round that copied the WAL asks
// the writer to copy what was written after it (checkpoint.go), and the
// writer does, on its own connection after its next group commit, once;
// so the next write can start the WAL again from its head instead of
// growing it to the autocheckpoint bound (whose checkpoint inside a commit
// stalled flushes 150–220 ms at 2,000 turns/s). The background loop is
// kept from starting and its round run by hand; what is copied is read
// from SQLite's WAL index (the -shm file), which a checkpoint run to look
// would change. Fails if the round does not ask, the writer does not copy,
// or it copies twice.
func TestCheckpointTailByWriter(t *testing.T) {
	s, c, side, put := byHandRounds(t)
	put("a")
	// put answers before its batch's runner goroutine ends; that runner
	// would take the round's ask for a's frames, which the round copied.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		s.group.mu.Lock()
		running := s.group.running
		s.group.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the group-commit runner did not end")
		}
	}
	// The round copies a's frames and, the WAL small, asks the writer.
	c.round(side)
	if !c.tail.Load() {
		t.Fatal("the background round left no tail to the writer")
	}
	put("b") // starts the WAL again (all copied); the writer copies b's frames after it
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		tails, cerr := c.tails, c.err
		c.mu.Unlock()
		if cerr != nil {
			t.Fatalf("checkpoint: %v", cerr)
		}
		if tails > 1 {
			t.Fatalf("the writer copied the tail %d times for one ask", tails)
		}
		if tails == 1 && !c.tail.Load() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer did not copy the tail it was asked for")
		}
	}
	frames, copied := walIndex(t, s.lead.file)
	if frames == 0 || copied != frames {
		t.Fatalf("after the writer's copy the WAL holds %d frames, %d of them copied", frames, copied)
	}
}

// walIndex reads the frames in SQLite's WAL (mxFrame) and how many of them
// are copied into the database (nBackfill) from the WAL index of db file
// (its -shm): two copies of the 48-byte header, mxFrame at byte 16 of
// each, then the checkpoint info with nBackfill first; native byte order.
func walIndex(t *testing.T, file string) (frames, copied uint32) {
	t.Helper()
	b, err := os.ReadFile(file + "-shm")
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 100 {
		t.Fatalf("WAL index of %d bytes", len(b))
	}
	return binary.NativeEndian.Uint32(b[16:]), binary.NativeEndian.Uint32(b[96:])
}

// TestCheckpointRoundAsksNoBacklog: a reader of an older snapshot on
// another connection (as a standby's) keeps a background pass from copying
// what was written after it; the round then must not hand the writer that
// backlog to copy inside its path. Fails if the round asks anyway.
func TestCheckpointRoundAsksNoBacklog(t *testing.T) {
	s, c, side, put := byHandRounds(t)
	reader, err := sql.Open("sqlite", c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	ctx := context.Background()
	put("a")
	tx, err := reader.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // read only
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM kv_layouts`).Scan(&n); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	put("b")
	put("c")
	c.round(side)
	if frames, copied := walIndex(t, s.lead.file); copied >= frames {
		t.Fatalf("the reader did not hold the checkpoint back (%d of %d frames copied): the test proves nothing", copied, frames)
	}
	if c.tail.Load() {
		t.Fatal("the round asked the writer to copy frames a reader held back")
	}
}

// byHandRounds is a leading SQLite store whose background checkpoint loop
// never starts (the test runs c.round itself, on side, a connection of its
// own), and put, a group commit of a layout named model.
func byHandRounds(t *testing.T) (s *sqlStore, c *checkpointer, side *sql.DB, put func(model string)) {
	t.Helper()
	s = leading(t, sqliteForTest(t)).(*sqlStore)
	c = s.ckpt
	c.once.Do(func() { close(c.done) })
	side, err := sql.Open("sqlite", c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { side.Close() })
	put = func(model string) {
		t.Helper()
		l := wbLayout
		l.Model = model
		if err := s.PutLayout(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
	return s, c, side, put
}
