package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// masterMetric reads one metric (without labels) from a master's /metrics.
func masterMetric(t *testing.T, c *cluster.Cluster, name string) float64 {
	t.Helper()
	_, b, _ := testutil.Get(t, c.Master.URL()+"/metrics")
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in the master's metrics", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestFramedSessionCalls: a client's plans and commits go on framed
// connections (package internal/frames) to a master that takes them, under
// the cluster's token, and as plain HTTP with PlainHTTP; a wrong token is
// refused either way.
func TestFramedSessionCalls(t *testing.T) {
	c := start(t, cluster.Config{Token: "s3cret"})
	ctx := context.Background()
	turn := func(cl *client.Client, id string) error {
		ss := cl.Sessions()
		if err := ss.SetLayout(ctx, tiny); err != nil {
			return err
		}
		for turn := 1; turn <= 3; turn++ {
			ids := seq(1, int64(turn*20))
			p, err := ss.Plan(ctx, id, client.PlanRequest{Model: "tiny", TokenIDs: ids})
			if err != nil {
				return err
			}
			if p.CachedTokens+p.PrefillTokens != int64(len(ids)) || (turn > 1) != (p.CachedTokens > 0) {
				return fmt.Errorf("turn %d: %d tokens cached and %d to prefill of %d", turn, p.CachedTokens, p.PrefillTokens, len(ids))
			}
			var fresh []byte
			for _, fr := range p.Fresh {
				fresh = append(fresh, kvBytes(id, fr.TokenStart, fr.TokenLength)...)
			}
			if _, err := ss.WriteAndCommit(ctx, id, p, fresh); err != nil {
				return err
			}
		}
		return nil
	}
	framed := c.Client() // the cluster's token
	defer framed.Close()
	if err := turn(framed, "f"); err != nil {
		t.Fatal(err)
	}
	calls := masterMetric(t, c, "gd2fs_master_framed_calls_total")
	if calls < 6 {
		t.Fatalf("%v calls on framed connections after 3 plans and 3 commits, want at least 6", calls)
	}
	if open := masterMetric(t, c, "gd2fs_master_framed_connections"); open < 1 {
		t.Fatalf("%v framed connections open", open)
	}
	// A file's Sync (an engine's, of the KV it saved) goes framed too: the
	// master names commits in its upgrade's answer.
	sync := func(cl *client.Client, path string) {
		t.Helper()
		f, err := cl.Create(ctx, path, client.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("saved")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := cl.Stat(ctx, path); err != nil || st.Size != 5 {
			t.Fatalf("after a Sync of 5 bytes: %+v, %v", st, err)
		}
	}
	sync(framed, "/fr/f")
	if got := masterMetric(t, c, "gd2fs_master_framed_calls_total"); got != calls+1 {
		t.Fatalf("%v framed calls after a Sync (and a stat of a file not a session's), want %v", got, calls+1)
	}
	calls++
	// A session file's stat (an engine's Open of it) goes framed too.
	sess, err := framed.Sessions().Get(ctx, "f")
	if err != nil || len(sess.Ranges) == 0 {
		t.Fatalf("session f: %+v, %v", sess, err)
	}
	u, err := client.ParseURI(sess.Ranges[0].KVURI)
	if err != nil {
		t.Fatal(err)
	}
	open := func(cl *client.Client) {
		t.Helper()
		f, err := cl.Open(ctx, u.Path)
		if err != nil || !f.Info().CommitRecordsSize || f.Info().Size == 0 || len(f.Info().Chunks) == 0 {
			t.Fatalf("the session file %s as opened: %+v, %v", u.Path, f.Info(), err)
		}
	}
	calls = masterMetric(t, c, "gd2fs_master_framed_calls_total")
	open(framed)
	if got := masterMetric(t, c, "gd2fs_master_framed_calls_total"); got != calls+1 {
		t.Fatalf("%v framed calls after the Open of a session file, want %v", got, calls+1)
	}
	calls++
	plain, err := client.New(client.Config{Master: c.Master.URL(), Token: "s3cret", PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := turn(plain, "p"); err != nil {
		t.Fatal(err)
	}
	sync(plain, "/fr/p")
	open(plain)
	if got := masterMetric(t, c, "gd2fs_master_framed_calls_total"); got != calls {
		t.Fatalf("a PlainHTTP client's calls were framed: %v, then %v", calls, got)
	}
	// On a connection upgraded with the token, each frame is checked
	// again: a wrong token in a frame is refused, and calls the SDK does
	// not frame are not taken.
	fc := &frames.Client{Transport: &http.Transport{}, Header: http.Header{"Authorization": {"Bearer s3cret"}}}
	defer fc.Close()
	json := http.Header{"Content-Type": {"application/json"}}
	a, err := fc.Do(ctx, c.Master.URL(), http.MethodPost, "/v1/sessions/f/commit", http.Header{"Authorization": {"Bearer wrong"}, "Content-Type": {"application/json"}}, []byte(`{"plan_id":1}`), false)
	if err != nil || a.Status != http.StatusUnauthorized {
		t.Fatalf("a frame with a wrong token: %d %s, %v", a.Status, a.Body, err)
	}
	for _, call := range [][2]string{{http.MethodGet, "/v1/status"}, {http.MethodPost, "/v1/servers/s0/drain"}, {http.MethodGet, frames.Path}} {
		a, err := fc.Do(ctx, c.Master.URL(), call[0], call[1], json, nil, false)
		if err != nil || a.Status != http.StatusBadRequest || !strings.Contains(string(a.Body), "plain HTTP") {
			t.Fatalf("%s %s in a frame: %d %s, %v", call[0], call[1], a.Status, a.Body, err)
		}
	}
	for _, plainHTTP := range []bool{false, true} {
		bad, err := client.New(client.Config{Master: c.Master.URL(), Token: "wrong", PlainHTTP: plainHTTP})
		if err != nil {
			t.Fatal(err)
		}
		_, err = bad.Sessions().Plan(ctx, "f", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, 80)})
		bad.Close()
		if !errors.Is(err, errs.ErrUnauthorized) {
			t.Fatalf("a plan with a wrong token (PlainHTTP %v): %v", plainHTTP, err)
		}
	}
}
