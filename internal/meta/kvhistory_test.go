package meta

import (
	"bytes"
	"context"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

// testKVHistory (conformance): nothing saved reads as nil, a save replaces
// the last one, a document past MaxKVHistory is refused and keeps the last.
func testKVHistory(t *testing.T, s Store) {
	ctx := context.Background()
	if got, err := s.KVHistory(ctx); err != nil || got != nil {
		t.Fatalf("nothing saved: %q, %v", got, err)
	}
	for _, doc := range []string{`{"draining":["a"]}`, `{"prev":[{"epoch":7}],"draining":[]}`} {
		if err := s.SaveKVHistory(ctx, []byte(doc)); err != nil {
			t.Fatal(err)
		}
		if got, err := s.KVHistory(ctx); err != nil || string(got) != doc {
			t.Fatalf("saved %s, read %q, %v", doc, got, err)
		}
	}
	mustIs(t, s.SaveKVHistory(ctx, bytes.Repeat([]byte("x"), MaxKVHistory+1)), errs.ErrTooLarge)
	if got, err := s.KVHistory(ctx); err != nil || !bytes.HasPrefix(got, []byte(`{"prev"`)) {
		t.Fatalf("a refused save changed the history: %.40q, %v", got, err)
	}
}
