package meta

import (
	"context"
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
// the writer to copy what was written during it (checkpoint.go), and the
// writer does, on its own connection, after its next group commit, once;
// so the next write can start the WAL again from its head instead of
// growing it to the autocheckpoint bound (whose checkpoint inside a commit
// stalled flushes 150–220 ms at 2,000 turns/s). Fails if the round does
// not ask or the writer does not answer.
func TestCheckpointTailByWriter(t *testing.T) {
	old := ckptEvery
	ckptEvery = time.Hour
	defer func() { ckptEvery = old }()
	s := leading(t, sqliteForTest(t)).(*sqlStore)
	ctx := context.Background()
	put := func(model string) {
		t.Helper()
		l := wbLayout
		l.Model = model
		if err := s.PutLayout(ctx, l); err != nil { // a group commit
			t.Fatal(err)
		}
	}
	put("a")
	for deadline := time.Now().Add(30 * time.Second); !s.ckpt.tail.Load(); time.Sleep(5 * time.Millisecond) {
		s.ckpt.mu.Lock()
		err := s.ckpt.err
		s.ckpt.mu.Unlock()
		if err != nil {
			t.Fatalf("background checkpoint: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the background round left no tail to the writer")
		}
	}
	put("b")
	put("c")
	s.ckpt.mu.Lock()
	tails, err := s.ckpt.tails, s.ckpt.err
	s.ckpt.mu.Unlock()
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if tails != 1 || s.ckpt.tail.Load() {
		t.Fatalf("the writer copied the tail %d times (want 1) and the ask is still up: %v", tails, s.ckpt.tail.Load())
	}
}
