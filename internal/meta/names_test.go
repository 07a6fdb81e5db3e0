package meta

import (
	"context"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

// testNames (in TestConformance): NUL, invalid UTF-8, control characters,
// "." and ".." are a bad request on both engines, before any SQL, and leave
// nothing behind (issue 22 findings 9 and 10).
func testNames(t *testing.T, s Store) {
	ctx := context.Background()
	if err := s.PutLayout(ctx, llama); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateFile(ctx, File{Path: "/f", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{".", "..", "a/b", "a\x00b", "a\xffb", "a\nb", "esc\x1b[2J", ""} {
		_, err := s.PlanSession(ctx, planIn(id, 10))
		mustIs(t, err, errs.ErrBadRequest)
	}
	if _, err := s.PlanSession(ctx, planIn("ok", 10)); err != nil {
		t.Fatal(err)
	}
	mustIs(t, s.ForkSession(ctx, "ok", "..", "", now), errs.ErrBadRequest)
	mustIs(t, s.ForkSession(ctx, "ok\x00", "x", "", now), errs.ErrBadRequest)
	for _, id := range []string{"a\x00b", "a\xffb"} {
		_, err := s.Session(ctx, id)
		mustIs(t, err, errs.ErrBadRequest)
		mustIs(t, s.DeleteSession(ctx, id), errs.ErrBadRequest)
		_, err = s.CommitSession(ctx, CommitInput{Session: id, PlanID: 1, Now: now})
		mustIs(t, err, errs.ErrBadRequest)
	}
	_, err = s.Sessions(ctx, "\xff", 10)
	mustIs(t, err, errs.ErrBadRequest)
	_, err = s.Sessions(ctx, "a\x00", 10)
	mustIs(t, err, errs.ErrBadRequest)
	ss, err := s.Sessions(ctx, "", 10)
	if err != nil || len(ss) != 1 || ss[0].ID != "ok" {
		t.Fatalf("sessions after the refusals: %+v %v", ss, err)
	}
	for _, m := range []string{"m\x00", "m\xff", "..", "a/b"} {
		bad := llama
		bad.Model = m
		mustIs(t, s.PutLayout(ctx, bad), errs.ErrBadRequest)
		in := planIn("p", 10)
		in.Model = m
		if m == "m\x00" || m == "m\xff" {
			_, err := s.PlanSession(ctx, in)
			mustIs(t, err, errs.ErrBadRequest)
			_, err = s.Layout(ctx, m)
			mustIs(t, err, errs.ErrBadRequest)
		}
	}
	mustIs(t, s.SetAttrs(ctx, "/f", map[string]string{"k": "v\x00"}), errs.ErrBadRequest)
	mustIs(t, s.SetAttrs(ctx, "/f", map[string]string{"k\xff": "v"}), errs.ErrBadRequest)
	mustIs(t, s.SetAttrs(ctx, "/f", map[string]string{"": "v"}), errs.ErrBadRequest)
	if a, err := s.Attrs(ctx, "/f"); err != nil || len(a) != 0 {
		t.Fatalf("attrs after the refusals: %v %v", a, err)
	}
	if err := s.SetAttrs(ctx, "/f", map[string]string{"note": "two\nlines"}); err != nil {
		t.Fatalf("a newline in an attribute value: %v", err)
	}
	_, err = s.CreateFile(ctx, File{Path: "/g", Pool: "ha", ChunkSize: 1 << 20, Modified: now, CreateID: "r\x00"})
	mustIs(t, err, errs.ErrBadRequest)
	_, err = s.File(ctx, "/g")
	mustIs(t, err, errs.ErrNotFound)
	for _, id := range []string{"x\x00", "x\xff", "..", ""} {
		mustIs(t, s.PutServer(ctx, Server{ID: id, Addr: "127.0.0.1:1"}), errs.ErrBadRequest)
	}
	mustIs(t, s.PutServer(ctx, Server{ID: "s1", Addr: "127.0.0.1:1\x00"}), errs.ErrBadRequest)
	if sv, err := s.Servers(ctx); err != nil || len(sv) != 0 {
		t.Fatalf("servers after the refusals: %+v %v", sv, err)
	}
	mustIs(t, s.PutPool(ctx, Pool{Name: "p\x00", Replicas: 1}), errs.ErrBadRequest)
}
