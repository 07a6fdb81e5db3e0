package master

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/internal/api"
)

// oldCommitBatch is POST /v1/sessions/commits' request as masters from
// before engine items decoded it (main at 8ce115d: api.CommitBatchRequest
// with plain items, read by readJSON with no hand decoder).
type oldCommitBatch struct {
	Commits []struct {
		Session string `json:"session"`
		PlanID  int64  `json:"plan_id"`
		Written bool   `json:"written,omitempty"`
	} `json:"commits"`
}

// TestEngineCommitsNeverMisread: a batch with an engine commit is never
// taken as plain commits. A master from before engine items refuses the
// body whole at /v1/sessions/commits (its strict decoder knows no
// fresh_kvcache) and has no /v1/sessions/commits/saved (404: the client
// then commits one at a time); this master refuses engine items at the
// plain route, and at the engine route checks each as the single route.
func TestEngineCommitsNeverMisread(t *testing.T) {
	saved := []api.KVRange{{TokenStart: 0, TokenLength: 16, KVURI: "gd2fs://local/kv-sessions/a/kv-1", KVStart: 0, KVLength: 4096}}
	empty := []api.KVRange{}
	for _, fresh := range []*[]api.KVRange{&saved, &empty} {
		body, err := json.Marshal(api.CommitBatchRequest{Commits: []api.CommitBatchItem{{Session: "b", PlanID: 1}, {Session: "a", PlanID: 2, Fresh: fresh}}})
		if err != nil {
			t.Fatal(err)
		}
		var old oldCommitBatch
		if err := decodeStrict(body, &old); err == nil || !strings.Contains(err.Error(), `unknown field "fresh_kvcache"`) {
			t.Fatalf("an old master decodes %s as %+v, %v: want an unknown field", body, old, err)
		}
	}

	m := startMaster(t, Config{Token: testToken})
	body := `{"commits":[{"session":"b","plan_id":1},{"session":"a","plan_id":2,"fresh_kvcache":[]}]}`
	code, ans := call(t, m, "POST", "/v1/sessions/commits", body)
	if code != 400 || !strings.Contains(ans, "/v1/sessions/commits/saved") {
		t.Fatalf("an engine commit at the plain batch route: %d %s, want 400 naming the engine route", code, ans)
	}
	// At the engine route each item gets the single route's answer: here,
	// no such plan.
	code, ans = call(t, m, "POST", "/v1/sessions/commits/saved", body)
	var got api.CommitBatchAnswer
	if code != 200 || json.Unmarshal([]byte(ans), &got) != nil || len(got.Commits) != 2 {
		t.Fatalf("the engine batch route: %d %s", code, ans)
	}
	for i, it := range []string{`{"plan_id":1}`, `{"plan_id":2,"fresh_kvcache":[]}`} {
		sess := []string{"b", "a"}[i]
		code, one := call(t, m, "POST", "/v1/sessions/"+sess+"/commit", it)
		var e api.Error
		if code/100 == 2 || json.Unmarshal([]byte(one), &e) != nil {
			t.Fatalf("single commit %s of %s: %d %s", it, sess, code, one)
		}
		if r := got.Commits[i]; r.Error == nil || *r.Error != e {
			t.Fatalf("commit %d of the batch answered %+v, the single route %+v", i, r, e)
		}
	}
}
