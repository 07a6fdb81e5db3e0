package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one gd2fs process (a master or a server) that the harness can
// kill, restart, stop and continue.
type proc struct {
	name    string // m0, s1, ...
	node    string // its namespace's name (without gdc-)
	argv    []string
	env     []string
	logPath string
	metrics string // http://addr/metrics, reached directly (not through its proxy)

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	starts  int
	stopped bool     // SIGSTOPped
	ending  bool     // the harness is ending it: an exit is expected
	exits   []string // exits the harness did not cause, with the log's last line
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	lf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(lf, "=== start %d: %s\n", p.starts+1, strings.Join(p.argv, " "))
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// The children die with the harness, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	p.cmd, p.done, p.stopped, p.ending = cmd, make(chan struct{}), false, false
	p.starts++
	done := p.done
	go func() {
		err := cmd.Wait()
		lf.Close()
		p.mu.Lock()
		if !p.ending {
			last := p.logTail(1)
			p.exits = append(p.exits, fmt.Sprintf("%s exited on its own (%v): %s", p.name, err, last))
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	p.stopped = sig == syscall.SIGSTOP
	return p.cmd.Process.Signal(sig)
}

// beginEnd marks the process as being ended by the harness (its exit is not
// a finding) and returns it, nil when it is not running. It is woken first:
// a stopped process dies as well, but Wait returns promptly only if it runs.
func (p *proc) beginEnd() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil, nil
	}
	p.ending = true
	p.cmd.Process.Signal(syscall.SIGCONT)
	return p.cmd, p.done
}

// kill sends SIGKILL and waits for the process to end.
func (p *proc) kill() {
	cmd, done := p.beginEnd()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop ends the process politely (SIGTERM, then SIGKILL after a while).
func (p *proc) stop() {
	cmd, done := p.beginEnd()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// takeExits returns the exits not reported yet.
func (p *proc) takeExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.exits
	p.exits = nil
	return e
}

// logTail returns the last n lines of the process's log.
func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// fds counts the process's open file descriptors.
func (p *proc) fds() int {
	pid := p.pid()
	if pid == 0 {
		return -1
	}
	es, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return -1
	}
	return len(es)
}

// goroutines reads go_goroutines from the process's /metrics.
func (p *proc) goroutines(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", p.metrics, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(n)
			}
		}
	}
	return -1
}
