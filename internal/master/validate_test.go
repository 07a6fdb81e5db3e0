package master

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/meta/metatest"
)

// TestNamesRefused: session ids, model names, server ids and text the
// store cannot hold get a 400 from the master, never a 503, and a refused
// heartbeat leaves no server behind (issue 22 findings 9 and 10).
func TestNamesRefused(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testNamesRefused(t, nil) })
	t.Run("postgres", func(t *testing.T) {
		if os.Getenv("GD2FS_TEST_POSTGRES") == "" {
			t.Skip("set GD2FS_TEST_POSTGRES")
		}
		ms, err := meta.Open(t.Context(), metatest.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		testNamesRefused(t, ms)
	})
}

func testNamesRefused(t *testing.T, ms meta.Store) {
	m := startMaster(t, Config{Token: testToken, Meta: ms})
	want(t, m, 200, "PUT", "/v1/models/m/layout", `{"layers":2,"kv_heads":2,"head_dim":4,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	for _, id := range []string{"%2e%2e", "%2e", "a%00b", "a%FFb", "a%0Ab"} {
		want(t, m, 400, "POST", "/v1/sessions/"+id+"/plan", `{"model":"m","prompt_tokens":16}`)
		if strings.Contains(id, "%00") || strings.Contains(id, "%FF") {
			want(t, m, 400, "GET", "/v1/sessions/"+id, "")
		}
	}
	want(t, m, 400, "POST", "/v1/sessions/ok/plan", `{"model":"m\u0000","prompt_tokens":16}`)
	want(t, m, 400, "PUT", "/v1/models/m%00/layout", `{"layers":2,"kv_heads":2,"head_dim":4,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	want(t, m, 400, "PUT", "/v1/models/%2e%2e/layout", `{"layers":2,"kv_heads":2,"head_dim":4,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	want(t, m, 400, "GET", "/v1/sessions?after=%FF", "")
	want(t, m, 400, "GET", "/v1/sessions?after=%00", "")
	want(t, m, 200, "PUT", "/v1/files/f", `{"pool":"perf"}`)
	want(t, m, 400, "PUT", "/v1/attrs/f", `{"k":"v\u0000"}`)
	want(t, m, 400, "PUT", "/v1/files/g", `{"pool":"perf","request_id":"r\u0000"}`)
	want(t, m, 400, "POST", "/v1/servers/heartbeat", `{"id":"x\u0000","addr":"127.0.0.1:1"}`)
	want(t, m, 400, "POST", "/v1/servers/heartbeat", `{"id":"..","addr":"127.0.0.1:1"}`)
	want(t, m, 400, "POST", "/v1/servers/heartbeat", `{"id":"s","addr":"nowhere"}`)
	if _, ans := call(t, m, "GET", "/v1/status", ""); strings.Contains(ans, `"x`) || strings.Contains(ans, `"up"`) {
		t.Fatalf("a refused heartbeat left a server: %s", ans)
	}
}

// TestCommitClaimsOnlyHeldBytes: a commit cannot claim chunks never
// allocated, indexes out of range, or a size past what its chunks hold
// (issue 22 finding 15); nor bytes no server was asked about: here the
// chunk's one server cannot be reached, so the commit is unavailable (with
// real servers: TestFileCommitPastWhatServersHold, internal/cluster).
func TestCommitClaimsOnlyHeldBytes(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	heartbeatAs(t, m, "s1", "127.0.0.1:1")
	want(t, m, 200, "PUT", "/v1/files/f", `{"pool":"perf","chunk_size":65536}`)
	want(t, m, 400, "POST", "/v1/commit/f", `{"size":10,"lengths":{"-1":5,"99999":5}}`)
	want(t, m, 400, "POST", "/v1/commit/f", `{"size":10}`)
	want(t, m, 200, "POST", "/v1/alloc/f", `{"indexes":[0]}`)
	want(t, m, 400, "POST", "/v1/commit/f", `{"size":10,"lengths":{"0":70000}}`)
	want(t, m, 400, "POST", "/v1/commit/f", `{"size":100,"lengths":{"0":10}}`)
	want(t, m, 503, "POST", "/v1/commit/f", `{"size":10,"lengths":{"0":10}}`)
	want(t, m, 400, "POST", "/v1/commit/f", `{"size":10,"seal":true}`)
	if _, ans := call(t, m, "GET", "/v1/files/f", ""); !strings.Contains(ans, `"size":0`) {
		t.Fatalf("after the commits: %s", ans)
	}
}

// TestLinkSourceRule: a link's source is s3://BUCKET/KEY with a real bucket
// name and no dot segments (issue 22 finding 17).
func TestLinkSourceRule(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	for _, src := range []string{"s3://../../etc/passwd", "s3://b/../x", "s3://bucket/a/./b", "s3://b%2F/k", "s3://../k", "s3://bucket/", "http://bucket/k", "s3://bucket/a\u0001b"} {
		want(t, m, 400, "POST", "/v1/link/l", `{"source":`+strconv.Quote(src)+`,"size":10}`)
	}
	if err := checkS3Source("s3://my-bucket.example/models/llama/model-00001.safetensors"); err != nil {
		t.Fatal(err)
	}
}

// TestListPages: ?limit= and ?after= page a directory; without them the
// whole listing comes as before (issue 22 finding 17).
func TestListPages(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	for i := range 25 {
		want(t, m, 200, "PUT", fmt.Sprintf("/v1/files/d/f%02d", i), `{"pool":"perf"}`)
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		code, ans := call(t, m, "GET", "/v1/list/d?limit=10&after="+url.QueryEscape(after), "")
		var l api.Listing
		if code != 200 || json.Unmarshal([]byte(ans), &l) != nil || len(l.Entries) > 10 || pages > 3 {
			t.Fatalf("page %d: %d %s", pages, code, ans)
		}
		for _, e := range l.Entries {
			got = append(got, e.Path)
		}
		if l.Next == "" {
			break
		}
		after = l.Next
	}
	if len(got) != 25 || got[0] != "/d/f00" || got[24] != "/d/f24" {
		t.Fatalf("paged listing: %v", got)
	}
	if _, ans := call(t, m, "GET", "/v1/list/d", ""); strings.Count(ans, `"path"`) != 25 {
		t.Fatalf("unpaged listing: %s", ans)
	}
	want(t, m, 400, "GET", "/v1/list/d?limit=0", "")
	want(t, m, 400, "GET", "/v1/list/d?after=%FF", "")
}
