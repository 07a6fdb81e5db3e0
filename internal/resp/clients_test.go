package resp_test

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// need returns the path of a client tool, or skips the test saying which
// package provides it (.ci/run installs them, so CI always runs these).
func need(t *testing.T, path, pkg string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not found: install Debian's %s to run this test", path, pkg)
	}
	return path
}

func hostPort(addr string) (string, string) {
	i := strings.LastIndexByte(addr, ':')
	return addr[:i], addr[i+1:]
}

// cli runs redis-cli with args against addr and returns its stdout.
func cli(t *testing.T, addr string, stdin []byte, args ...string) string {
	t.Helper()
	bin := need(t, "/usr/bin/redis-cli", "redis-tools")
	h, p := hostPort(addr)
	cmd := exec.Command(bin, append([]string{"-h", h, "-p", p}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// TestRedisCLI drives every command through redis-cli (the C client), with
// a token, binary values from a file, a missing key and --pipe.
func TestRedisCLI(t *testing.T) {
	need(t, "/usr/bin/redis-cli", "redis-tools")
	c := startCluster(t, 3, "tok")
	a, b := c.RESP[0].Addr(), c.RESP[2].Addr()
	auth := []string{"--no-auth-warning", "-a", "tok"}
	run := func(addr string, args ...string) string {
		t.Helper()
		return strings.TrimRight(cli(t, addr, nil, append(auth, args...)...), "\n")
	}

	if got := cli(t, a, nil, "GET", "x"); !strings.Contains(got, "NOAUTH") {
		t.Errorf("without a password: %q", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, "PONG"},
		{[]string{"ECHO", "hi"}, "hi"},
		{[]string{"SELECT", "0"}, "OK"},
		{[]string{"SET", "k1", "v1"}, "OK"},
		{[]string{"SET", "k1", "v2"}, "OK"}, // RESP SET overwrites
		{[]string{"GET", "k1"}, "v2"},
		{[]string{"SET", "k1", "v3", "NX"}, ""},
		{[]string{"SET", "k2", "w", "NX"}, "OK"},
		{[]string{"SET", "k3", "z", "XX"}, ""},
		{[]string{"SET", "k2", "w2", "XX"}, "OK"},
		{[]string{"MSET", "m1", "a", "m2", "b"}, "OK"},
		{[]string{"MGET", "m1", "missing", "m2"}, "a\n\nb"},
		{[]string{"EXISTS", "k1", "k2", "missing"}, "2"},
		{[]string{"STRLEN", "k2"}, "2"},
		{[]string{"GETRANGE", "k2", "1", "-1"}, "2"},
		{[]string{"GET", "missing"}, ""},
		{[]string{"TYPE", "k1"}, "string"},
		{[]string{"DBSIZE"}, "4"},
		{[]string{"DEL", "m1", "missing"}, "1"},
		{[]string{"UNLINK", "m2"}, "1"},
		{[]string{"DBSIZE"}, "2"},
		{[]string{"CLIENT", "SETNAME", "cli"}, "OK"},
		{[]string{"CLIENT", "SETINFO", "LIB-NAME", "x"}, "OK"},
		{[]string{"CONFIG", "GET", "appendonly"}, "appendonly\nno"},
		{[]string{"COMMAND", "COUNT"}, "35"},
		{[]string{"SET", "k", "v", "EX", "1000"}, "OK"},
		{[]string{"TTL", "k"}, "1000"},
		{[]string{"PERSIST", "k"}, "1"},
		{[]string{"TTL", "k"}, "-1"},
		{[]string{"EXPIRE", "k", "0"}, "1"},
		{[]string{"EXISTS", "k"}, "0"},
		{[]string{"FLUSHALL"}, "ERR unknown command 'FLUSHALL', with args beginning with: "},
	} {
		// Alternate endpoints: every one serves the whole key space.
		if got := run(a, tc.args...); got != tc.want {
			t.Errorf("redis-cli %s: got %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
		a, b = b, a
	}
	if got := run(a, "--scan"); len(strings.Fields(got)) != 2 {
		t.Errorf("--scan: %q", got)
	}
	if got := run(a, "INFO", "keyspace"); !strings.Contains(got, "db0:keys=2,expires=0") {
		t.Errorf("INFO keyspace: %q", got)
	}
	if got := run(a, "INFO"); !strings.Contains(got, "keyspace_hits:") || !strings.Contains(got, "connected_clients:") || !strings.Contains(got, "used_memory:") {
		t.Errorf("INFO: %q", got)
	}

	// Binary values from a file (-x takes the last argument from stdin),
	// 3 MiB with every byte value, read back byte-exact from another server.
	val := make([]byte, 3<<20)
	rand.Read(val)
	val[0], val[1], val[2] = '\r', '\n', 0
	if got := strings.TrimSpace(cli(t, a, val, append(auth, "-x", "SET", "bin")...)); got != "OK" {
		t.Fatalf("-x SET: %q", got)
	}
	got := cli(t, b, nil, append(auth, "--raw", "GET", "bin")...)
	if !bytes.Equal([]byte(got), append(val, '\n')) {
		t.Fatalf("binary value: got %d bytes, want %d", len(got), len(val))
	}

	// --pipe: raw protocol from a file, replies counted by redis-cli.
	var pipe bytes.Buffer
	for i := 0; i < 1000; i++ {
		pipe.Write(encode("SET", "pipe:"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+"-"+strconv.Itoa(i), strings.Repeat("v", i)))
	}
	out := cli(t, a, pipe.Bytes(), append(auth, "--pipe")...)
	if !strings.Contains(out, "errors: 0, replies: 1000") {
		t.Fatalf("--pipe: %q", out)
	}
	if got := run(b, "DBSIZE"); got != "1003" {
		t.Errorf("DBSIZE after --pipe: %q", got)
	}

	// RESP3 through redis-cli -3 (HELLO 3 first): a miss prints (nil)
	// from "_", a map from HELLO.
	if got := cli(t, a, nil, append(auth, "-3", "GET", "missing")...); strings.TrimSpace(got) != "" {
		t.Errorf("-3 GET missing: %q", got)
	}
	if got := cli(t, a, nil, append(auth, "-3", "--no-raw", "GET", "missing")...); strings.TrimSpace(got) != "(nil)" {
		t.Errorf("-3 --no-raw GET missing: %q", got)
	}
	if got := cli(t, a, nil, append(auth, "-3", "--no-raw", "HELLO", "3")...); !strings.Contains(got, `1# "server" => "gd2fs"`) {
		t.Errorf("-3 HELLO 3: %q", got)
	}
	if got := cli(t, a, nil, append(auth, "-3", "--no-raw", "GET", "k2")...); strings.TrimSpace(got) != `"w2"` {
		t.Errorf("-3 GET k2: %q", got)
	}
}

// python runs a redis-py script with Debian's python3 (the first python3 on
// PATH may be another installation without redis-py).
func python(t *testing.T, script string, env ...string) string {
	t.Helper()
	py := need(t, "/usr/bin/python3", "python3")
	if err := exec.Command(py, "-c", "import redis").Run(); err != nil {
		t.Skip("redis-py not found for /usr/bin/python3: install Debian's python3-redis to run this test")
	}
	f := filepath.Join(t.TempDir(), "t.py")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, f)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	return string(out)
}

const redisPyScript = `
import os, threading, hashlib, redis
host, port = os.environ["ADDR"].rsplit(":", 1)
r = redis.Redis(host=host, port=int(port), password="tok", client_name="redis-py-test")

# Handshake: AUTH then CLIENT SETNAME (redis-py 4.3 speaks RESP2).
assert r.ping() is True
assert r.client_getname() == "redis-py-test"

# Plain commands.
assert r.set("a", b"\x00\x01\r\n") is True
assert r.get("a") == b"\x00\x01\r\n"
assert r.get("missing") is None
assert r.exists("a", "missing") == 1
assert r.set("a", b"x", nx=True) is None
assert r.mset({"b": b"1", "c": b"2"}) is True
assert r.mget(["a", "b", "missing", "c"]) == [b"\x00\x01\r\n", b"1", None, b"2"]
assert r.strlen("b") == 1
assert r.getrange("a", 0, 1) == b"\x00\x01"
assert r.delete("b", "missing") == 1
assert r.dbsize() == 2
assert sorted(r.scan_iter(match="*")) == [b"a", b"c"]
# TTLs (long ones: no answer depends on the test's speed).
assert r.set("t", b"v", ex=1000) is True
assert 999 <= r.ttl("t") <= 1000, r.ttl("t")
assert r.set("t2", b"v", px=2000000) is True
assert 1990000 <= r.pttl("t2") <= 2000000
assert r.persist("t") is True and r.ttl("t") == -1
assert r.expire("t", 500) is True and 499 <= r.ttl("t") <= 500
assert r.set("t", b"w", keepttl=True) is True and 498 <= r.ttl("t") <= 500
assert r.expire("t", 0) is True and r.get("t") is None
assert r.ttl("missing") == -2
assert r.delete("t2") == 1

# Pipelines (transaction=False: gd2fs has no MULTI).
p = r.pipeline(transaction=False)
for i in range(200):
    p.set("p%d" % i, str(i) * 100)
for i in range(200):
    p.get("p%d" % i)
p.get("missing")
res = p.execute()
assert res[:200] == [True] * 200, res[:3]
assert res[200:400] == [(str(i) * 100).encode() for i in range(200)]
assert res[400] is None

# The default pipeline is a MULTI/EXEC transaction (queued, run at EXEC).
with r.pipeline() as tp:
    tp.set("tx1", b"a").get("tx1").exists("tx1", "missing")
    assert tp.execute() == [True, b"a", 1]

# 8 threads, a connection pool, values up to 256 KiB.
errors = []
def worker(n):
    try:
        for i in range(40):
            k = "t%d-%d" % (n, i)
            v = hashlib.sha256(k.encode()).digest() * (1 + (i * 997 % 8192))
            r.set(k, v)
            assert r.get(k) == v, k
    except Exception as e:
        errors.append(e)
ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not errors, errors

# A 32 MiB value.
big = os.urandom(32 << 20)
assert r.set("big", big) is True
assert r.get("big") == big
assert r.strlen("big") == len(big)
print("ok")
`

// TestRedisPy runs Debian's redis-py against a server: handshake,
// pipelines, 8 threads, a 32 MiB value.
func TestRedisPy(t *testing.T) {
	c := startCluster(t, 3, "tok")
	if out := python(t, redisPyScript, "ADDR="+c.RESP[1].Addr()); strings.TrimSpace(out) != "ok" {
		t.Fatalf("redis-py: %s", out)
	}
}

// lmcacheScript follows LMCache's RedisConnector (lmcache/v1/storage_backend/
// connector/redis_connector.py): per chunk a "<key>kv_bytes" and a
// "<key>metadata" key; put sets kv_bytes first, then metadata; contains is
// EXISTS on metadata, stopping at the first miss (the cached prefix); get
// reads metadata then kv_bytes and, when kv_bytes is gone, deletes the
// metadata key.
const lmcacheScript = `
import os, redis, struct
host, port = os.environ["ADDR"].rsplit(":", 1)
r = redis.Redis.from_url("redis://:tok@%s:%s" % (host, port))
prefix = "vllm@llama-3-8b@1@0@"
chunks = [prefix + "%016x" % (i * 0x9e3779b97f4a7c15 & (2**64 - 1)) for i in range(16)]

def put(key, kv):
    meta = struct.pack("<qiii", len(kv), 2, 256, 4096)
    r.set(key + "kv_bytes", kv)
    r.set(key + "metadata", meta)

def contains_prefix(keys):
    n = 0
    for k in keys:
        if not r.exists(k + "metadata"):
            return n
        n += 1
    return n

def get(key):
    meta = r.get(key + "metadata")
    if meta is None:
        return None
    length = struct.unpack("<qiii", meta)[0]
    kv = r.get(key + "kv_bytes")
    if kv is None:
        r.delete(key + "metadata")
        return None
    assert len(kv) == length
    return kv

data = {k: os.urandom(256 * 1024 + i) for i, k in enumerate(chunks)}
for k in chunks[:12]:
    put(k, data[k])
assert contains_prefix(chunks) == 12, contains_prefix(chunks)
for k in chunks[:12]:
    assert get(k) == data[k]
assert get(chunks[13]) is None

# A half-present pair: metadata without kv_bytes (evicted, or its owner
# died). get() must answer a miss and clean up, and contains stops there.
r.delete(chunks[5] + "kv_bytes")
assert get(chunks[5]) is None
assert r.exists(chunks[5] + "metadata") == 0
assert contains_prefix(chunks) == 5
print("ok")
`

// TestLMCachePattern runs LMCache's access pattern through redis-py.
func TestLMCachePattern(t *testing.T) {
	c := startCluster(t, 3, "tok")
	if out := python(t, lmcacheScript, "ADDR="+c.RESP[2].Addr()); strings.TrimSpace(out) != "ok" {
		t.Fatalf("lmcache pattern: %s", out)
	}
}
