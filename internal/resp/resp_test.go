package resp_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/resp"
)

// startCluster runs a master and n servers, each with a RESP front end, on
// ephemeral loopback ports.
func startCluster(t *testing.T, n int, token string) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), Servers: n, MemBytes: 8 << 20,
		KVMemBytes: 192 << 20, Token: token, RESP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rconn is a raw RESP connection: the tests write bytes and check the reply
// bytes themselves, so what is checked is the wire, not a client library.
type rconn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *rconn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	return &rconn{t: t, nc: nc, br: bufio.NewReaderSize(nc, 1<<20)}
}

func encode(args ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.Bytes()
}

func (c *rconn) send(raw []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(raw); err != nil {
		c.t.Fatal(err)
	}
}

// do sends one command and returns its whole reply, raw.
func (c *rconn) do(args ...string) string {
	c.t.Helper()
	c.send(encode(args...))
	return c.reply()
}

// reply reads one complete reply (any RESP2/RESP3 type), raw.
func (c *rconn) reply() string {
	c.t.Helper()
	var b strings.Builder
	c.nc.SetDeadline(time.Now().Add(60 * time.Second))
	if err := readReply(c.br, &b); err != nil {
		c.t.Fatalf("reading reply: %v (so far %q)", err, b.String())
	}
	return b.String()
}

func readReply(br *bufio.Reader, out *strings.Builder) error {
	line, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	out.WriteString(line)
	if !strings.HasSuffix(line, "\r\n") || len(line) < 3 {
		return fmt.Errorf("bad line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', '-', ':', '_', '#', ',':
		return nil
	case '$', '=':
		n, err := strconv.Atoi(body)
		if err != nil {
			return err
		}
		if n < 0 {
			return nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return err
		}
		out.Write(buf)
		return nil
	case '*', '~', '%':
		n, err := strconv.Atoi(body)
		if err != nil {
			return err
		}
		if line[0] == '%' {
			n *= 2
		}
		for i := 0; i < n; i++ {
			if err := readReply(br, out); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown reply type %q", line)
}

func bulk(s string) string { return fmt.Sprintf("$%d\r\n%s\r\n", len(s), s) }

func eq(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %q, want %q", what, got, want)
	}
}

// TestRESP3Bytes checks the reply bytes of the handshake newer clients send
// (HELLO 3, then CLIENT SETINFO) and of the basic types under RESP3 and RESP2.
func TestRESP3Bytes(t *testing.T) {
	c := startCluster(t, 1, "")
	r := dial(t, c.RESP[0].Addr())

	eq(t, "RESP2 missing key", r.do("GET", "missing"), "$-1\r\n")
	hello := r.do("HELLO", "3")
	if !strings.HasPrefix(hello, "%7\r\n"+bulk("server")+bulk("gd2fs")+bulk("version")+bulk("7.0.0")+bulk("proto")+":3\r\n"+bulk("id")+":") {
		t.Fatalf("HELLO 3: %q", hello)
	}
	if !strings.HasSuffix(hello, bulk("mode")+bulk("standalone")+bulk("role")+bulk("master")+bulk("modules")+"*0\r\n") {
		t.Fatalf("HELLO 3 tail: %q", hello)
	}
	eq(t, "SETINFO", r.do("CLIENT", "SETINFO", "LIB-NAME", "redis-py"), "+OK\r\n")
	eq(t, "SETINFO ver", r.do("CLIENT", "SETINFO", "LIB-VER", "5.0.1"), "+OK\r\n")
	eq(t, "RESP3 missing key", r.do("GET", "missing"), "_\r\n")
	eq(t, "SET", r.do("SET", "k", "hello\r\nworld"), "+OK\r\n")
	eq(t, "GET", r.do("GET", "k"), bulk("hello\r\nworld"))
	eq(t, "EXISTS", r.do("EXISTS", "k", "missing", "k"), ":2\r\n")
	eq(t, "MGET", r.do("MGET", "k", "missing"), "*2\r\n"+bulk("hello\r\nworld")+"_\r\n")
	eq(t, "CONFIG GET", r.do("CONFIG", "GET", "save"), "%1\r\n"+bulk("save")+bulk(""))
	eq(t, "STRLEN", r.do("STRLEN", "k"), ":12\r\n")
	eq(t, "GETRANGE", r.do("GETRANGE", "k", "-5", "-1"), bulk("world"))
	eq(t, "GETRANGE missing", r.do("GETRANGE", "missing", "0", "-1"), bulk(""))
	eq(t, "DEL", r.do("DEL", "k", "missing"), ":1\r\n")
	eq(t, "RESET", r.do("RESET"), "+RESET\r\n")
	eq(t, "RESP2 again", r.do("GET", "k"), "$-1\r\n")
	eq(t, "HELLO 2", r.do("HELLO", "2")[:3], "*14")
	eq(t, "HELLO 4", r.do("HELLO", "4"), "-NOPROTO unsupported protocol version\r\n")
	eq(t, "PING", r.do("PING"), "+PONG\r\n")
	eq(t, "PING msg", r.do("PING", "x"), bulk("x"))
	eq(t, "ECHO", r.do("ECHO", "e"), bulk("e"))
	eq(t, "SELECT 0", r.do("SELECT", "0"), "+OK\r\n")
	eq(t, "SELECT 1", r.do("SELECT", "1"), "-ERR DB index is out of range\r\n")
	eq(t, "TTL", r.do("TTL", "missing"), ":-2\r\n")
	eq(t, "QUIT", r.do("QUIT"), "+OK\r\n")
	if _, err := r.br.ReadByte(); err != io.EOF {
		t.Fatalf("after QUIT the server should close the connection, got %v", err)
	}
}

// TestRedisErrors checks error replies word for word against Redis 7's
// (server.c, t_string.c, networking.c), and that the connection survives
// every one of them except protocol errors.
func TestRedisErrors(t *testing.T) {
	c := startCluster(t, 1, "")
	r := dial(t, c.RESP[0].Addr())
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"FOO", "a", "b"}, "-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n"},
		{[]string{"FLUSHALL"}, "-ERR unknown command 'FLUSHALL', with args beginning with: \r\n"},
		{[]string{"NO\r\nPE", "x"}, "-ERR unknown command 'NO  PE', with args beginning with: 'x' \r\n"},
		{[]string{"GET"}, "-ERR wrong number of arguments for 'get' command\r\n"},
		{[]string{"SET", "a", "b", "NX", "XX"}, "-ERR syntax error\r\n"},
		{[]string{"SET", "a", "b", "EX", "x"}, "-ERR value is not an integer or out of range\r\n"},
		{[]string{"SET", "a", "b", "EX", "0"}, "-ERR invalid expire time in 'set' command\r\n"},
		{[]string{"SET", "a", "b", "BOGUS"}, "-ERR syntax error\r\n"},
		{[]string{"CLIENT", "FOO"}, "-ERR unknown subcommand 'FOO'. Try CLIENT HELP.\r\n"},
		{[]string{"SELECT", "x"}, "-ERR value is not an integer or out of range\r\n"},
		{[]string{"SCAN", "x"}, "-ERR invalid cursor\r\n"},
		{[]string{"HELLO", "x"}, "-ERR Protocol version is not an integer or out of range\r\n"},
		{[]string{"HELLO", "3", "xyz"}, "-ERR Syntax error in HELLO option 'xyz'\r\n"},
		{[]string{"MSET", "a"}, "-ERR wrong number of arguments for 'mset' command\r\n"},
		{[]string{"MSET", "a", "b", "c"}, "-ERR wrong number of arguments for 'mset' command\r\n"},
	} {
		eq(t, strings.Join(tc.args, " "), r.do(tc.args...), tc.want)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"SET", "a", "b", "EX", "10", "PX", "10"}, "-ERR syntax error\r\n"},
		{[]string{"SET", "a", "b", "KEEPTTL", "EX", "10"}, "-ERR syntax error\r\n"},
		{[]string{"SET", "a", "b", "EX"}, "-ERR syntax error\r\n"},
		{[]string{"SET", "a", "b", "PX", "-5"}, "-ERR invalid expire time in 'set' command\r\n"},
		{[]string{"SET", "a", "b", "EX", "9223372036854775807"}, "-ERR invalid expire time in 'set' command\r\n"},
		{[]string{"EXPIRE", "a", "10", "NX", "XX"}, "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n"},
		{[]string{"EXPIRE", "a", "10", "GT", "LT"}, "-ERR GT and LT options at the same time are not compatible\r\n"},
		{[]string{"EXPIRE", "a", "10", "FOO"}, "-ERR Unsupported option FOO\r\n"},
		{[]string{"EXPIRE", "a", "x"}, "-ERR value is not an integer or out of range\r\n"},
		{[]string{"EXPIRE", "a", "9223372036854775807"}, "-ERR invalid expire time in 'expire' command\r\n"},
		{[]string{"PERSIST"}, "-ERR wrong number of arguments for 'persist' command\r\n"},
	} {
		eq(t, strings.Join(tc.args, " "), r.do(tc.args...), tc.want)
	}
	// MULTI/EXEC: commands queued, run at EXEC, replies in one array.
	eq(t, "EXEC alone", r.do("EXEC"), "-ERR EXEC without MULTI\r\n")
	eq(t, "MULTI", r.do("MULTI"), "+OK\r\n")
	eq(t, "MULTI nested", r.do("MULTI"), "-ERR MULTI calls can not be nested\r\n")
	eq(t, "queued SET", r.do("SET", "tx", "v"), "+QUEUED\r\n")
	eq(t, "queued GET", r.do("GET", "tx"), "+QUEUED\r\n")
	eq(t, "EXEC", r.do("EXEC"), "*2\r\n+OK\r\n"+bulk("v"))
	eq(t, "MULTI again", r.do("MULTI"), "+OK\r\n")
	eq(t, "queued bad", r.do("GET"), "-ERR wrong number of arguments for 'get' command\r\n")
	eq(t, "EXECABORT", r.do("EXEC"), "-EXECABORT Transaction discarded because of previous errors.\r\n")
	eq(t, "MULTI discard", r.do("MULTI"), "+OK\r\n")
	eq(t, "DISCARD", r.do("DISCARD"), "+OK\r\n")
	eq(t, "still alive", r.do("PING"), "+PONG\r\n")
}

// TestAuth: the cluster token is the password; nothing but AUTH, HELLO,
// QUIT and RESET runs before it; HELLO 3 AUTH logs in and switches.
func TestAuth(t *testing.T) {
	c := startCluster(t, 1, "s3cret")
	r := dial(t, c.RESP[0].Addr())
	eq(t, "GET before AUTH", r.do("GET", "k"), "-NOAUTH Authentication required.\r\n")
	eq(t, "SET before AUTH", r.do("SET", "k", "v"), "-NOAUTH Authentication required.\r\n")
	eq(t, "HELLO 3 before AUTH", r.do("HELLO", "3")[:28], "-NOAUTH HELLO must be called")
	eq(t, "wrong password", r.do("AUTH", "nope"), "-WRONGPASS invalid username-password pair or user is disabled.\r\n")
	// Before AUTH a command may have at most 10 arguments of 16 KiB
	// (Redis's limits): a bigger one is a protocol error.
	r.send([]byte("*2\r\n$3\r\nGET\r\n$100000\r\n"))
	eq(t, "big bulk before AUTH", r.reply(), "-ERR Protocol error: unauthenticated bulk length\r\n")

	r = dial(t, c.RESP[0].Addr())
	r.send([]byte("*11\r\n"))
	eq(t, "many args before AUTH", r.reply(), "-ERR Protocol error: unauthenticated multibulk length\r\n")

	r = dial(t, c.RESP[0].Addr())
	eq(t, "AUTH user pass", r.do("AUTH", "default", "s3cret"), "+OK\r\n")
	eq(t, "SET after AUTH", r.do("SET", "k", "v"), "+OK\r\n")

	r = dial(t, c.RESP[0].Addr())
	h := r.do("HELLO", "3", "AUTH", "anyone", "s3cret", "SETNAME", "lmcache")
	if !strings.HasPrefix(h, "%7\r\n") {
		t.Fatalf("HELLO 3 AUTH: %q", h)
	}
	eq(t, "GETNAME", r.do("CLIENT", "GETNAME"), bulk("lmcache"))
	eq(t, "GET after HELLO AUTH", r.do("GET", "k"), bulk("v"))
	eq(t, "RESET logs out", r.do("RESET"), "+RESET\r\n")
	eq(t, "GET after RESET", r.do("GET", "k"), "-NOAUTH Authentication required.\r\n")
}

// TestBadInput sends what a broken or hostile client might: every case gets
// an error (or a closed connection for a stream that cannot be parsed any
// more) and the server keeps serving others.
func TestBadInput(t *testing.T) {
	c := startCluster(t, 1, "")
	addr := c.RESP[0].Addr()
	for _, tc := range []struct {
		name, in, want string
	}{
		{"bulk length 2^40", "*2\r\n$3\r\nGET\r\n$1099511627776\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"negative bulk", "*2\r\n$3\r\nGET\r\n$-5\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"array length 2^40", "*1099511627776\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"array length garbage", "*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"nested arrays", "*1\r\n" + strings.Repeat("*1\r\n", 10000), "-ERR Protocol error: expected '$', got '*'\r\n"},
		{"bulk without CRLF", "*1\r\n$3\r\nGETxx", "-ERR Protocol error: expected CRLF after a bulk string of 3 bytes\r\n"},
		{"garbage line", "\x00\x01\x02 hello\r\n", "-ERR unknown command '\x00\x01\x02', with args beginning with: 'hello' \r\n"},
		{"long garbage without newline", strings.Repeat("x", 200<<10), "-ERR Protocol error: too big inline request\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dial(t, addr)
			r.send([]byte(tc.in))
			eq(t, tc.name, r.reply(), tc.want)
		})
	}
	// An unterminated array: the server waits for the rest; the client
	// goes away; nothing is left behind.
	r := dial(t, addr)
	r.send([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n"))
	r.nc.Close()

	// A value over the limit is read past and refused; the connection
	// stays usable (the next command in the same write is answered).
	r = dial(t, addr)
	big := make([]byte, 64<<20+1)
	var b bytes.Buffer
	fmt.Fprintf(&b, "*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%d\r\n", len(big))
	b.Write(big)
	b.WriteString("\r\n")
	b.Write(encode("PING"))
	go r.nc.Write(b.Bytes())
	got := r.reply()
	if !strings.HasPrefix(got, "-ERR value of 67108865 bytes is over this server's limit of 67108864 bytes") {
		t.Fatalf("over-limit value: %q", got)
	}
	eq(t, "after over-limit value", r.reply(), "+PONG\r\n")
	eq(t, "key too long", r.do("GET", strings.Repeat("k", 1025)), "-ERR gd2fs keys are 1 to 1024 bytes long; this one has 1025\r\n")
	eq(t, "empty key", r.do("SET", "", "v"), "-ERR gd2fs keys are 1 to 1024 bytes long; this one has 0\r\n")
	eq(t, "still serving", dial(t, addr).do("PING"), "+PONG\r\n")
}

// TestPipeline sends 400 commands in one write and reads 400 replies in
// order, with values of random sizes, some over 1 MiB.
func TestPipeline(t *testing.T) {
	c := startCluster(t, 3, "")
	r := dial(t, c.RESP[1].Addr())
	src := rand.NewChaCha8([32]byte{1})
	rng := rand.New(src)
	vals := make([]string, 200)
	var b bytes.Buffer
	for i := range vals {
		n := rng.IntN(64 << 10)
		if i%25 == 0 {
			n = 1<<20 + i // several DRAM pages, sent with writev
		}
		v := make([]byte, n)
		src.Read(v)
		vals[i] = string(v)
		b.Write(encode("SET", "p"+strconv.Itoa(i), vals[i]))
	}
	for i := range vals {
		b.Write(encode("GET", "p"+strconv.Itoa(i)))
	}
	go r.nc.Write(b.Bytes())
	for i := range vals {
		eq(t, "SET "+strconv.Itoa(i), r.reply(), "+OK\r\n")
	}
	for i := range vals {
		if got := r.reply(); got != bulk(vals[i]) {
			t.Fatalf("GET p%d: %d bytes, want %d", i, len(got), len(bulk(vals[i])))
		}
	}
	// Every endpoint sees the same key space.
	for i := range c.RESP {
		eq(t, "DBSIZE on "+strconv.Itoa(i), dial(t, c.RESP[i].Addr()).do("DBSIZE"), ":200\r\n")
	}
}

// TestScanAllKeys: SCAN with small counts returns every key exactly once
// across three servers, and MATCH filters.
func TestScanAllKeys(t *testing.T) {
	c := startCluster(t, 3, "")
	r := dial(t, c.RESP[0].Addr())
	want := map[string]bool{}
	for i := 0; i < 300; i++ {
		k := fmt.Sprintf("key:%d", i)
		want[k] = true
		eq(t, "SET", r.do("SET", k, "v"), "+OK\r\n")
	}
	seen := map[string]int{}
	cursor := "0"
	for calls := 0; ; calls++ {
		if calls > 1000 {
			t.Fatal("SCAN does not end")
		}
		r.send(encode("SCAN", cursor, "COUNT", "7"))
		var keys []string
		cursor, keys = parseScan(t, r)
		for _, k := range keys {
			seen[k]++
		}
		if cursor == "0" {
			break
		}
	}
	for k := range want {
		if seen[k] != 1 {
			t.Errorf("key %s seen %d times", k, seen[k])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("SCAN returned %d keys, want %d", len(seen), len(want))
	}
}

func parseScan(t *testing.T, r *rconn) (string, []string) {
	t.Helper()
	raw := r.reply()
	lines := strings.Split(raw, "\r\n")
	if lines[0] != "*2" {
		t.Fatalf("SCAN reply %q", raw)
	}
	cursor := lines[2]
	n, _ := strconv.Atoi(strings.TrimPrefix(lines[3], "*"))
	var keys []string
	for i := 0; i < n; i++ {
		keys = append(keys, lines[5+2*i])
	}
	return cursor, keys
}

// TestGateway: the stateless gateway (gd2fs resp) forwards every key and
// sees what the servers' own endpoints wrote.
func TestGateway(t *testing.T) {
	c := startCluster(t, 3, "tok")
	gw, err := resp.Gateway("127.0.0.1:0", c.Master.URL(), "tok", "", 0, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(context.Background())
	t.Cleanup(func() { gw.Close() })
	s := dial(t, c.RESP[0].Addr())
	g := dial(t, gw.Addr())
	eq(t, "AUTH", s.do("AUTH", "tok"), "+OK\r\n")
	eq(t, "AUTH gw", g.do("AUTH", "tok"), "+OK\r\n")
	for i := 0; i < 20; i++ {
		eq(t, "SET", s.do("SET", "g"+strconv.Itoa(i), strconv.Itoa(i)), "+OK\r\n")
	}
	for i := 0; i < 20; i++ {
		eq(t, "GET via gateway", g.do("GET", "g"+strconv.Itoa(i)), bulk(strconv.Itoa(i)))
	}
	eq(t, "DBSIZE via gateway", g.do("DBSIZE"), ":20\r\n")
	eq(t, "SET via gateway", g.do("SET", "gw", "x"), "+OK\r\n")
	eq(t, "GET via server", s.do("GET", "gw"), bulk("x"))
	eq(t, "DEL via gateway", g.do("DEL", "gw", "g0", "nope"), ":2\r\n")
	eq(t, "EXISTS", s.do("EXISTS", "gw", "g0", "g1"), ":1\r\n")
	if info := g.do("INFO", "server"); !strings.Contains(info, "gd2fs_role:gateway") {
		t.Errorf("INFO server: %q", info)
	}
}
