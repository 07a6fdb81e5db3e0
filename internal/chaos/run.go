package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/internal/weights"
	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver, for the fresh schema
)

// Config is one run of the harness.
type Config struct {
	Bin           string        // the gd2fs binary
	Duration      time.Duration // of the fault schedule (the load runs throughout)
	Seed          uint64
	Faults        []string
	Servers       int
	NetNS         string        // auto, on or off
	Hold          time.Duration // how long each fault is in force
	Gap           time.Duration // at least this long between a heal and the next fault
	RecoveryBound time.Duration // every kind must succeed again within this after a heal
	OpTimeout     time.Duration // each operation's deadline
	Postgres      string        // DSN; empty: one master on SQLite
	KeepFiles     int           // files each writer keeps, removing older ones (0: never remove)
	Strict        bool          // availability findings are fatal too
	WorkDir       string        // default: a new temporary directory
	Keep          bool          // keep the work dir (logs, data) after a clean run
	Command       string        // the command line, for the report
	Out           io.Writer     // progress
}

const token = "chaos-token"

// cluster is the running system under test.
type cluster struct {
	cfg      *Config
	net      *Net
	netNote  string
	masters  []*proc
	servers  []*proc
	proxies  map[string]*Proxy // inbound, by process name
	pgRelays map[string]*Proxy // by master name
	s3relay  *Proxy
	dataDir  map[string]string
	tmpfs    bool
	mounts   []string
	murls    string // every master, through its proxy
	direct   map[string]string
	s3       *s3test.Server
	closers  []func()
}

func (c *cluster) logf(format string, a ...any) { fmt.Fprintf(c.cfg.Out, format+"\n", a...) }

func (c *cluster) masterByName(n string) *proc {
	for _, p := range c.masters {
		if p.name == n {
			return p
		}
	}
	return nil
}

// leader returns the master that answers /v1/status (a standby answers 503).
func (c *cluster) leader() *proc {
	for _, m := range c.masters {
		if c.leads(m) {
			return m
		}
	}
	return nil
}

// leads asks m directly (not through its proxy) whether it leads.
func (c *cluster) leads(m *proc) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+c.direct[m.name]+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// Result is what a run found.
type Result struct {
	Violations int64 // wrong bytes and lost acknowledged writes: always fatal
	Findings   []string
	Report     string // markdown
}

// Run starts the cluster, runs the load and the schedule, checks the
// invariants and returns the report.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	// One run at a time: a run owns every gdc-* namespace and link. Only
	// root makes those, so other users lock their own file.
	lockName := "gd2fs-chaos.lock"
	if uid := os.Geteuid(); uid != 0 {
		lockName = fmt.Sprintf("gd2fs-chaos-%d.lock", uid)
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintln(cfg.Out, "chaos: another run holds", lock.Name(), "- waiting for it")
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			return nil, err
		}
	}
	if os.Geteuid() == 0 {
		cleanupMounts() // the lock is ours: any gdc-* tmpfs is a leftover
	}
	c := &cluster{cfg: &cfg, net: &Net{}, proxies: map[string]*Proxy{}, pgRelays: map[string]*Proxy{}, dataDir: map[string]string{}, direct: map[string]string{}}
	ok, why := netnsUsable()
	switch cfg.NetNS {
	case "on":
		if !ok {
			return nil, fmt.Errorf("--netns=on: namespaces unavailable: %s", why)
		}
		c.net.On = true
	case "off":
		c.netNote = "loopback (--netns=off)"
	default:
		c.net.On = ok
		if !ok {
			c.netNote = "loopback: network namespaces unavailable (" + why + "); partitions are proxy blackholes (inbound only), packet loss is skipped"
		}
	}
	if c.net.On {
		c.netNote = "network namespaces gdc-* on bridge " + bridgeName + " (" + subnet + ".0/24), faults cut with nftables"
	}
	if cfg.WorkDir == "" {
		if cfg.WorkDir, err = os.MkdirTemp("", "gd2fs-chaos-"); err != nil {
			return nil, err
		}
	}
	clean := false
	defer func() {
		c.close()
		if clean && !cfg.Keep {
			os.RemoveAll(cfg.WorkDir)
		} else {
			c.logf("chaos: logs and data kept in %s", cfg.WorkDir)
		}
	}()
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	res, err := c.exercise(ctx)
	if err == nil && res.Violations == 0 {
		clean = true
	}
	return res, err
}

func (c *cluster) close() {
	for _, p := range c.servers {
		p.stop()
	}
	for _, p := range c.masters {
		p.stop()
	}
	for _, p := range c.proxies {
		p.Close()
	}
	for _, p := range c.pgRelays {
		p.Close()
	}
	if c.s3relay != nil {
		c.s3relay.Close()
	}
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
	for _, m := range c.mounts {
		exec.Command("umount", "-l", m).Run()
	}
	c.net.teardown()
}

// start builds the cluster: S3, metadata, masters, servers and proxies.
func (c *cluster) start(ctx context.Context) error {
	cfg := c.cfg
	if err := c.net.setup(); err != nil {
		return fmt.Errorf("network namespaces: %w", err)
	}
	host := "127.0.0.1"
	if c.net.On {
		host = hostIP
	}
	logs := filepath.Join(cfg.WorkDir, "logs")
	os.MkdirAll(logs, 0o755)

	// Metadata: a fresh schema on PostgreSQL for two masters, else SQLite.
	nm := 1
	dsns := []string{"sqlite://" + filepath.Join(cfg.WorkDir, "meta.db")}
	if cfg.Postgres != "" {
		schema := fmt.Sprintf("chaos_%d", time.Now().UnixNano())
		db, err := sql.Open("pgx", cfg.Postgres)
		if err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
			db.Close()
			return fmt.Errorf("PostgreSQL %s: %w", redact(cfg.Postgres), err)
		}
		c.onClose(func() { db.Exec("DROP SCHEMA " + schema + " CASCADE"); db.Close() })
		u, err := url.Parse(cfg.Postgres)
		if err != nil {
			return err
		}
		nm, dsns = 2, nil
		// In namespaces, a PostgreSQL on the host's loopback is reached
		// through NAT (one TCP connection end to end, so a partition cuts
		// the session for the database too); otherwise, and for the
		// blackholes of loopback mode, through a relay per master.
		if pgHost, pgPort, _ := net.SplitHostPort(u.Host); c.net.On && (pgHost == "127.0.0.1" || pgHost == "localhost") {
			if err := c.net.natLoopback(pgPort); err != nil {
				return fmt.Errorf("NAT to PostgreSQL: %w", err)
			}
			v := *u
			v.Host = net.JoinHostPort(hostIP, pgPort)
			q := v.Query()
			q.Set("search_path", schema)
			v.RawQuery = q.Encode()
			for i := 0; i < nm; i++ {
				dsns = append(dsns, v.String())
			}
		}
		for i := 0; i < nm && len(dsns) < nm; i++ {
			// Each master reaches PostgreSQL through its own relay on the
			// host, so a partition of the master cuts its database session too.
			relay, err := NewProxy(net.JoinHostPort(host, "0"), u.Host)
			if err != nil {
				return err
			}
			c.pgRelays[fmt.Sprintf("m%d", i)] = relay
			v := *u
			v.Host = relay.Addr()
			q := v.Query()
			q.Set("search_path", schema)
			v.RawQuery = q.Encode()
			dsns = append(dsns, v.String())
		}
	}

	// S3 with the linked model, reached by the servers through a relay.
	s3 := s3test.Start("chaos", "chaos-secret")
	c.onClose(s3.Close)
	s3.CreateBucket("models")
	model := make([]byte, 24<<20)
	fill(cfg.Seed, linkedKey, 0, model)
	if err := s3.Put("models", "chaos/model.bin", model); err != nil {
		return err
	}
	s3u, _ := url.Parse(s3.URL)
	relay, err := NewProxy(net.JoinHostPort(host, "0"), s3u.Host)
	if err != nil {
		return err
	}
	c.s3relay = relay
	c.s3 = s3

	// Masters, each behind an inbound proxy.
	var murls []string
	for i := 0; i < nm; i++ {
		name := fmt.Sprintf("m%d", i)
		listen, px, err := c.addProxied(name, 11+i, "7070", host)
		if err != nil {
			return err
		}
		murls = append(murls, "http://"+px.Addr())
		p := &proc{name: name, node: name, logPath: filepath.Join(logs, name+".log"), metrics: "http://" + listen + "/metrics", env: []string{"GD2FS_TOKEN=" + token}}
		p.argv = c.net.command(name, cfg.Bin, "master", "--listen", listen, "--advertise", "http://"+px.Addr(),
			"--meta", dsns[i], "--cluster", "chaos", "--down-after", "3s", "--repair-after", "10s")
		c.masters = append(c.masters, p)
	}
	c.murls = strings.Join(murls, ",")
	for _, m := range c.masters {
		if err := m.start(); err != nil {
			return err
		}
	}

	// Servers: data dirs on small tmpfs mounts where we may mount (so one
	// can be filled), each behind an inbound proxy that it advertises.
	c.tmpfs = os.Geteuid() == 0
	for i := 0; i < cfg.Servers; i++ {
		name := fmt.Sprintf("s%d", i)
		dir := filepath.Join(cfg.WorkDir, name)
		os.MkdirAll(dir, 0o755)
		if c.tmpfs {
			if err := run("mount", "-t", "tmpfs", "-o", "size=384m", "gdc-"+name, dir); err != nil {
				c.tmpfs = false
				c.logf("chaos: cannot mount a tmpfs (%v): disk-full is skipped", err)
			} else {
				c.mounts = append(c.mounts, dir)
			}
		}
		c.dataDir[name] = dir
		listen, px, err := c.addProxied(name, 21+i, "7071", host)
		if err != nil {
			return err
		}
		p := &proc{name: name, node: name, logPath: filepath.Join(logs, name+".log"), metrics: "http://" + listen + "/metrics",
			env: []string{"GD2FS_TOKEN=" + token, "AWS_ACCESS_KEY_ID=chaos", "AWS_SECRET_ACCESS_KEY=chaos-secret", "AWS_REGION=us-east-1"}}
		p.argv = c.net.command(name, cfg.Bin, "server", "--master", c.murls, "--id", name,
			"--listen", listen, "--advertise", px.Addr(), "--mem", "32MiB", "--disk", dir+":1GiB", "--kv-mem", "64MiB",
			"--heartbeat", "500ms", "--s3-endpoint", "http://"+c.s3relay.Addr())
		c.servers = append(c.servers, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	c.logf("chaos: %d master(s) (%s), %d servers; %s; work dir %s", nm, map[bool]string{true: "PostgreSQL", false: "SQLite"}[nm > 1],
		cfg.Servers, c.netNote, cfg.WorkDir)
	return nil
}

// addProxied gives process name its network node (address octet, its
// port in its own namespace, a free loopback port without namespaces) and
// an inbound proxy on host that the harness cuts, delays and resets.
func (c *cluster) addProxied(name string, octet int, port, host string) (listen string, px *Proxy, err error) {
	ip, err := c.net.addNode(name, octet)
	if err != nil {
		return "", nil, err
	}
	if !c.net.On {
		port = freePort()
	}
	listen = net.JoinHostPort(ip, port)
	if px, err = NewProxy(net.JoinHostPort(host, "0"), listen); err != nil {
		return "", nil, err
	}
	c.proxies[name], c.direct[name] = px, listen
	return listen, px, nil
}

func (c *cluster) onClose(f func()) { c.closers = append(c.closers, f) }

func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil {
		return u.Redacted()
	}
	return "(dsn)"
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "0"
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

// newClient connects to every master through its proxy.
func (c *cluster) newClient() (*client.Client, error) {
	return client.New(client.Config{Master: c.murls, Token: token, Timeout: 10 * time.Second})
}

// waitUp waits until a master leads and sees n servers up.
func (c *cluster) waitUp(ctx context.Context, cl *client.Client, n int, within time.Duration) error {
	start := time.Now()
	deadline := start.Add(within)
	var last string
	told := false
	for time.Now().Before(deadline) {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cl.Status(sctx)
		cancel()
		var up []string
		for _, s := range st.Servers {
			if s.State == "up" {
				up = append(up, s.ID)
			}
		}
		if err == nil && len(up) >= n {
			return nil
		}
		last = fmt.Sprintf("%d of %d servers up (%v)", len(up), n, err)
		if !told && time.Since(start) > 10*time.Second {
			// Slow: say what the master sees, and what the missing servers say.
			told = true
			c.logf("chaos: after 10s the master sees servers up: %v (%v)", up, err)
			for _, p := range c.servers {
				if !slices.Contains(up, p.name) {
					c.logf("chaos: %s is not up; its log ends:\n%s", p.name, p.logTail(5))
				}
			}
		}
		sleepCtx(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return errors.New(last)
}

// linkModel links the S3 object, as `gd2fs model link` does.
func (c *cluster) linkModel(ctx context.Context, cl *client.Client) (string, int64, error) {
	src, err := cold.New(cold.Config{Endpoint: c.s3.URL, AccessKey: "chaos", SecretKey: "chaos-secret", Region: "us-east-1"})
	if err != nil {
		return "", 0, err
	}
	fs, err := weights.Link(ctx, cl, src, "s3://models/chaos/", "/chaos/linked", client.LinkOptions{Pool: "perf", ChunkSize: 2 << 20})
	if err != nil || len(fs) != 1 {
		return "", 0, fmt.Errorf("link: %v (%d files)", err, len(fs))
	}
	return fs[0].Path, fs[0].Size, nil
}

// procs are every master and server, for the leak check.
func (c *cluster) procs() []*proc { return append(append([]*proc{}, c.masters...), c.servers...) }

type usage struct {
	pid, fds, goroutines int
}

func (c *cluster) usage(ctx context.Context) map[string]usage {
	out := map[string]usage{}
	for _, p := range c.procs() {
		out[p.name] = usage{pid: p.pid(), fds: p.fds(), goroutines: p.goroutines(ctx)}
	}
	return out
}
