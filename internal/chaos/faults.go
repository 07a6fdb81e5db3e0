package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Faults the harness knows, in the order docs/reliability.md explains them.
var AllFaults = []string{"kill", "pause", "partition", "leader-partition", "leader-kill", "disk-full", "loss", "delay", "reset"}

// DefaultCIFaults are the faults of the short run in scripts/test.sh.
var DefaultCIFaults = []string{"kill", "pause", "partition", "disk-full", "loss", "reset"}

// step is one scheduled fault.
type step struct {
	fault  string
	victim string // a process name, "leader", or "all"
	hold   time.Duration

	injected, healedAt time.Time
	skipped            string
	recovery           [nKinds]time.Duration
	bad                [nKinds]int
	note               string
}

// schedule picks a victim for each fault in turn, repeating the list
// until the duration is used (every step takes about hold + gap).
func schedule(faults []string, servers int, seed uint64, d, hold, gap time.Duration) []*step {
	r := rand.New(rand.NewPCG(seed, 99))
	var out []*step
	var t time.Duration
	for i := 0; len(faults) > 0; i++ {
		f := faults[i%len(faults)]
		if t+hold+gap > d && len(out) > 0 {
			break
		}
		s := &step{fault: f, hold: hold}
		switch f {
		case "kill", "pause", "partition", "disk-full":
			s.victim = fmt.Sprintf("s%d", r.IntN(servers))
		case "leader-partition", "leader-kill":
			s.victim = "leader"
		default:
			s.victim = "all servers"
		}
		out = append(out, s)
		t += hold + gap
		if i > 1000 {
			break
		}
	}
	return out
}

func (c *cluster) server(name string) *proc {
	for _, p := range c.servers {
		if p.name == name {
			return p
		}
	}
	return nil
}

// inject starts s's fault; heal ends it.
func (c *cluster) inject(s *step) error {
	switch s.fault {
	case "kill":
		c.server(s.victim).kill()
	case "pause":
		return c.server(s.victim).signal(syscall.SIGSTOP)
	case "partition":
		return c.partition(c.server(s.victim), true)
	case "leader-partition", "leader-kill":
		m := c.leader()
		if m == nil {
			return errors.New("no master leads")
		}
		s.victim = m.name
		if s.fault == "leader-kill" {
			m.kill()
			return nil
		}
		return c.partition(m, true)
	case "disk-full":
		return c.fillDisk(c.server(s.victim))
	case "loss":
		for _, p := range append(append([]*proc{}, c.servers...), c.masters...) {
			if err := c.net.loss(p.node, 5); err != nil {
				return err
			}
		}
	case "delay":
		for _, p := range c.servers {
			c.proxies[p.name].SetDelay(5 * time.Millisecond)
		}
	case "reset":
		for _, p := range c.servers {
			c.proxies[p.name].SetResetRate(0.002)
		}
	default:
		return fmt.Errorf("unknown fault %q (known: %v)", s.fault, AllFaults)
	}
	return nil
}

func (c *cluster) heal(s *step) error {
	switch s.fault {
	case "kill", "leader-kill":
		p := c.server(s.victim)
		if p == nil {
			p = c.masterByName(s.victim)
		}
		return p.start()
	case "pause":
		return c.server(s.victim).signal(syscall.SIGCONT)
	case "partition", "leader-partition":
		p := c.server(s.victim)
		if p == nil {
			p = c.masterByName(s.victim)
		}
		return c.partition(p, false)
	case "disk-full":
		return os.Remove(filepath.Join(c.dataDir[s.victim], "gdc-ballast"))
	case "loss":
		for _, p := range append(append([]*proc{}, c.servers...), c.masters...) {
			c.net.heal(p.node)
		}
	case "delay", "reset":
		for _, p := range c.servers {
			c.proxies[p.name].Heal()
		}
	}
	return nil
}

// unsupported says why a fault cannot run in this cluster ("" when it can).
func (c *cluster) unsupported(f string) string {
	switch f {
	case "leader-partition", "leader-kill":
		if len(c.masters) < 2 {
			return "one master (no PostgreSQL: set GD2FS_TEST_POSTGRES for two)"
		}
	case "disk-full":
		if !c.tmpfs {
			return "server data dirs are not small tmpfs mounts (needs root)"
		}
	case "loss":
		if !c.net.On {
			return "packet loss needs network namespaces (nftables per node)"
		}
	}
	return ""
}

// partition cuts p off the network (nftables in its namespace), or on
// loopback holds every byte at its proxies (its inbound proxy and, for a
// master, its PostgreSQL relay): there a server still heartbeats.
func (c *cluster) partition(p *proc, on bool) error {
	if c.net.On {
		if on {
			return c.net.cut(p.node)
		}
		c.net.heal(p.node)
		return nil
	}
	c.proxies[p.name].SetBlackhole(on)
	if r := c.pgRelays[p.name]; r != nil {
		r.SetBlackhole(on)
	}
	return nil
}

// fillDisk writes a ballast file into p's data dir until the file system
// is full: the server's own accounting still sees room, the disk does not.
func (c *cluster) fillDisk(p *proc) error {
	f, err := os.Create(filepath.Join(c.dataDir[p.name], "gdc-ballast"))
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}
