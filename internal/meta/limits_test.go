package meta

import (
	"context"
	"math"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

// TestLimits: figures beyond the explicit maxima are refused with a bad
// request before any arithmetic, on both engines (issue 16, items 3 and 4).
func TestLimits(t *testing.T) {
	for name, open := range engines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t)

			// A size past the maximum is refused; one at the maximum is kept.
			f, err := s.CreateFile(ctx, File{Path: "/big", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Commit(ctx, f.ID, math.MaxInt64, nil, false, now)
			mustIs(t, err, errs.ErrBadRequest)
			if _, err := s.Commit(ctx, f.ID, 1<<50, nil, false, now); err != nil {
				t.Fatal(err)
			}

			// Totals keeps answering when the stored sizes sum past int64
			// (a database written before sizes were bounded).
			g, _ := s.CreateFile(ctx, File{Path: "/big2", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
			if _, err := s.(*sqlStore).db.ExecContext(ctx, s.(*sqlStore).q(`UPDATE files SET size = ? WHERE id = ? OR id = ?`), int64(math.MaxInt64), f.ID, g.ID); err != nil {
				t.Fatal(err)
			}
			n, b, err := s.Totals(ctx)
			if err != nil || n < 2 || b != math.MaxInt64 {
				t.Fatalf("Totals = %d files, %d bytes, %v; want saturated bytes and no error", n, b, err)
			}

			// Layout fields whose product wraps int64.
			huge := llama
			huge.Layers = 1 << 62
			mustIs(t, s.PutLayout(ctx, huge), errs.ErrBadRequest)
			wrap := llama
			wrap.Layers, wrap.KVHeads, wrap.HeadDim, wrap.PageTokens = 4096, 4096, 65536, 1<<20
			mustIs(t, s.PutLayout(ctx, wrap), errs.ErrBadRequest)
			if err := s.PutLayout(ctx, llama); err != nil {
				t.Fatal(err)
			}

			// Token counts whose sum wraps.
			in := planIn("s-limits", 10)
			in.DecodeTokens = math.MaxInt64
			_, err = s.PlanSession(ctx, in)
			mustIs(t, err, errs.ErrBadRequest)
			in = planIn("s-limits", math.MaxInt64)
			_, err = s.PlanSession(ctx, in)
			mustIs(t, err, errs.ErrBadRequest)
			mustIs(t, s.PutPrefix(ctx, Prefix{Path: "/big", Model: "llama", Tokens: math.MaxInt64}), errs.ErrBadRequest)
		})
	}
}
