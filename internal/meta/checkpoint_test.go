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
