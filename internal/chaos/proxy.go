package chaos

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a fault-injecting TCP proxy: it forwards every connection it
// accepts to one target and can, on demand, delay each forwarded segment,
// reset connections at random (RST, as a crashed peer or a middlebox does)
// or hold every byte (a blackhole: the peer looks alive at the TCP level
// but nothing arrives, as in a partition). The kernel here has no netem
// qdisc, so these faults are made in user space.
type Proxy struct {
	ln     net.Listener
	target string

	delay     atomic.Int64 // nanoseconds added before forwarding each segment
	resetPerM atomic.Int64 // chance per million that a segment resets its connection
	hole      atomic.Bool
	holeMu    sync.Mutex
	holeCond  *sync.Cond

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	Resets atomic.Int64 // connections reset by the proxy
}

// NewProxy listens on listen (host:port, port 0 for any) and forwards to target.
func NewProxy(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.holeCond = sync.NewCond(&p.holeMu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay delays every forwarded segment by d (0: none).
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// SetResetRate resets a connection with probability frac per forwarded segment.
func (p *Proxy) SetResetRate(frac float64) { p.resetPerM.Store(int64(frac * 1e6)) }

// SetBlackhole holds (on) or releases (off) every byte in both directions.
func (p *Proxy) SetBlackhole(on bool) {
	p.holeMu.Lock()
	p.hole.Store(on)
	p.holeMu.Unlock()
	if !on {
		p.holeCond.Broadcast()
	}
}

// Heal turns every fault off.
func (p *Proxy) Heal() {
	p.SetDelay(0)
	p.SetResetRate(0)
	p.SetBlackhole(false)
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.SetBlackhole(false)
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: back off
			continue
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				reset(c)
				return
			}
			if !p.track(u) {
				return
			}
			defer p.untrack(u)
			done := make(chan struct{}, 2)
			go func() { p.pipe(u, c); done <- struct{}{} }()
			go func() { p.pipe(c, u); done <- struct{}{} }()
			<-done
			// One direction ended: end both, so neither side waits on a
			// half-open connection.
			c.Close()
			u.Close()
			<-done
		}()
	}
}

// reset closes c with an RST rather than a FIN.
func reset(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		t.SetLinger(0)
	}
	c.Close()
}

func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.hole.Load() {
				p.holeMu.Lock()
				for p.hole.Load() {
					p.holeCond.Wait()
				}
				p.holeMu.Unlock()
			}
			if d := p.delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			if r := p.resetPerM.Load(); r > 0 && rand.Int64N(1e6) < r {
				p.Resets.Add(1)
				reset(src)
				reset(dst)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			if t, ok := dst.(*net.TCPConn); ok {
				t.CloseWrite()
				return
			}
			return
		}
	}
}
