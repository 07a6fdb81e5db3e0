package meta

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cutProxy forwards TCP connections to a server. While it holds, what the
// server sends next on any connection waits in the proxy instead of
// reaching the client; cut closes the connections that have something
// held (it never arrives) and lets the others, and later ones, flow.
type cutProxy struct {
	addr    string
	holding atomic.Bool
	mu      sync.Mutex
	held    []net.Conn // both ends of each connection with data held
	cutCh   chan struct{}
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), cutCh: make(chan struct{})}
	var all []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		mu.Lock()
		for _, c := range all {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			all = append(all, c, sc)
			mu.Unlock()
			go p.pipe(sc, c, false)
			go p.pipe(c, sc, true)
		}
	}()
	return p
}

// pipe copies src to dst; toClient: src is the server.
func (p *cutProxy) pipe(dst, src net.Conn, toClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if toClient && p.holding.Load() {
				p.mu.Lock()
				p.held = append(p.held, dst, src)
				cutCh := p.cutCh
				p.mu.Unlock()
				<-cutCh // never delivered: the connection is cut
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *cutProxy) hold() { p.holding.Store(true) }

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding.Store(false)
	for _, c := range p.held {
		c.Close()
	}
	p.held = nil
	close(p.cutCh)
	p.cutCh = make(chan struct{})
}

// TestOneTripCommittedAnswerLost (PostgreSQL, flush mode): a log-only
// flush's pipeline commits on the server, and its connection is cut
// before the answer reaches the leader. The leader cannot tell a commit
// from a rollback: it drops memory, takes a new term, and the commit that
// waited runs again in SQL, where it must be recognised as applied
// (last_plan) and answered as a success with the session it made, not
// refused as a plan no longer outstanding.
func TestOneTripCommittedAnswerLost(t *testing.T) {
	ctx := context.Background()
	dsn := PostgresDSNForTest(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, u.Host)
	u.Host = proxy.addr
	s := leading(t, openShared(t, u.String())).(*sqlStore)
	if err := s.SetSessionDurability(DurabilityFlush); err != nil {
		t.Fatal(err)
	}
	direct, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	if err := s.PutLayout(ctx, wbLayout); err != nil {
		t.Fatal(err)
	}
	ids := seqIDs(1, 20)
	wbTurn(t, s, "x", ids, true)
	wbTurn(t, s, "x", ids[:16], true)
	// The proxy holds the server's answers from the flush's start; under
	// load the flush's answer can still get through (the commit is then
	// answered as usual, nothing lost, the term unchanged): the scenario
	// did not happen, and it is tried again with the next plan.
	var p Plan
	var term int64
	for attempt := 1; ; attempt++ {
		p = wbTurn(t, s, "x", ids, false) // outstanding, in SQL
		var again bool
		term, again = oneTripLostAnswer(t, s, proxy, direct, p, int64(len(ids)+4))
		if !again {
			break
		}
		if attempt == 5 {
			t.Fatal("in 5 tries the proxy never held a flush's answer")
		}
		t.Logf("try %d: the flush's answer got through the proxy; again", attempt)
	}
	var now int64
	if err := direct.QueryRowContext(ctx, `SELECT v FROM counters WHERE k = 'lead_term'`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if now != term+1 || s.leadTerm.Load() != now {
		t.Fatalf("lead term %d in SQL, %d in the store; want both %d: a new term after a flush of unknown outcome", now, s.leadTerm.Load(), term+1)
	}
	// The next turn starts a new file (the old one is of the old term) and
	// memory answers again after it.
	next := wbTurn(t, s, "x", ids, true)
	if len(next.Fresh) == 0 || next.Fresh[0].Path == p.Fresh[0].Path {
		t.Fatalf("after the new term x's plan wrote %+v, want a new file (its last plan wrote %+v)", next.Fresh, p.Fresh)
	}
	st := s.WriteBehindStats()
	wbTurn(t, s, "x", ids, true)
	if s.WriteBehindStats().Fast == st.Fast {
		t.Fatal("memory no longer answers after the new term")
	}
}

// oneTripLostAnswer commits outstanding plan p with proxy holding the
// answers of the flush that writes it, cuts the connection once the commit
// is in SQL, and checks the commit is answered as applied (a session of
// tokens) after running again in SQL. It returns the lead term before,
// and again true when the flush's answer got through the proxy all the
// same (nothing lost: the caller tries again).
func oneTripLostAnswer(t *testing.T, s *sqlStore, proxy *cutProxy, direct *sql.DB, p Plan, tokens int64) (int64, bool) {
	t.Helper()
	ctx := context.Background()
	var term int64
	if err := direct.QueryRowContext(ctx, `SELECT v FROM counters WHERE k = 'lead_term'`).Scan(&term); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	h := func() error {
		once.Do(proxy.hold)
		return nil
	}
	flushHook.Store(&h)
	defer flushHook.Store(nil)
	st := s.WriteBehindStats()
	type answer struct {
		s   Session
		err error
	}
	done := make(chan answer, 1)
	go func() {
		got, err := s.CommitSession(ctx, CommitInput{Session: "x", PlanID: p.ID, Written: true, Now: time.Now()})
		done <- answer{got, err}
	}()
	// The commit is in SQL while its answer waits in the proxy.
	for {
		var last int64
		if err := direct.QueryRowContext(ctx, `SELECT last_plan FROM kv_sessions WHERE id = 'x'`).Scan(&last); err != nil {
			t.Fatal(err)
		}
		if last == p.ID {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("the commit was answered (%+v, %v) before its flush committed", a.s, a.err)
		default:
		}
	}
	proxy.cut()
	a := <-done
	if a.err != nil {
		t.Fatalf("a commit applied in SQL, its answer lost with the connection, fails when it runs again: %v", a.err)
	}
	if a.s.Tokens != tokens {
		t.Fatalf("the commit answers a session of %d tokens, want %d", a.s.Tokens, tokens)
	}
	now := s.WriteBehindStats()
	var nowTerm int64
	if err := direct.QueryRowContext(ctx, `SELECT v FROM counters WHERE k = 'lead_term'`).Scan(&nowTerm); err != nil {
		t.Fatal(err)
	}
	if now.Slow == st.Slow && now.FailedFlushes == st.FailedFlushes && nowTerm == term {
		return term, true // the answer got through: nothing was lost
	}
	if now.Slow[1][SlowLost]-st.Slow[1][SlowLost] != 1 {
		t.Fatalf("%d commits ran again in SQL, want 1 (its flush's answer was lost); in SQL before %v, after %v",
			now.Slow[1][SlowLost]-st.Slow[1][SlowLost], st.Slow, now.Slow)
	}
	return term, false
}
