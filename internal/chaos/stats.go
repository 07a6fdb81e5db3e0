package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// Kind is a kind of operation the load makes.
type Kind int

const (
	HAWrite Kind = iota
	HARead
	PerfWrite
	PerfRead
	KVPut
	KVGet
	SessionPlan
	SessionCommit
	LinkedRead
	nKinds
)

var kindNames = [nKinds]string{"ha write", "ha read", "perf write", "perf read", "kv put", "kv get", "session plan+load", "session write+commit", "linked read"}

func (k Kind) String() string { return kindNames[k] }

// Outcome classifies one operation.
type Outcome int

const (
	OK          Outcome = iota
	Miss                // a clean miss: not found where losing data is allowed
	Shortened           // a plan whose stored part the master cut short (a server down): it works, with less cached
	Unavailable         // errs.ErrUnavailable, a timeout, a refused or reset connection
	Other               // any other error: not an integrity violation, but worth reading
	WrongBytes          // a read returned bytes that were never written there: fatal
	LostAck             // an acknowledged HA write is gone or changed: fatal
	nOutcomes
)

var outcomeNames = [nOutcomes]string{"ok", "clean miss", "shortened", "unavailable", "other error", "WRONG BYTES", "LOST ACK"}

func (o Outcome) String() string { return outcomeNames[o] }

// classify maps an operation's error to an outcome; missOK says whether a
// not-found is a clean miss for this kind.
func classify(err error, missOK bool) Outcome {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, errs.ErrNotFound) && missOK:
		return Miss
	case errors.Is(err, errs.ErrUnavailable), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, errs.ErrNoSpace):
		return Unavailable
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return Unavailable
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return Unavailable
	}
	return Other
}

// Stats counts operations by kind and outcome, bytes verified, error
// messages, and the first success of each kind after each heal.
type Stats struct {
	counts   [nKinds][nOutcomes]atomic.Int64
	verified atomic.Int64
	maxLat   [nKinds]atomic.Int64

	mu        sync.Mutex
	errSample map[string]int    // "kind | outcome | message" -> count
	errFirst  map[string]string // the same key -> the fault label when it was first seen
	examples  []string          // every integrity violation, in full
	healAt    time.Time         // zero while a fault is in force
	faultAt   time.Time
	t0        time.Time
	label     string                // the fault in force, or the last one healed
	recovered [nKinds]time.Duration // -1: not yet since the last heal
	duringBad [nKinds]int           // failed operations while the current fault was in force
}

func newStats() *Stats {
	s := &Stats{errSample: map[string]int{}, errFirst: map[string]string{}, t0: time.Now(), label: "before any fault"}
	for i := range s.recovered {
		s.recovered[i] = -1
	}
	return s
}

var digits = regexp.MustCompile(`[0-9]+`)

// record counts one operation that started at start.
func (s *Stats) record(k Kind, o Outcome, start time.Time, err error, detail string) {
	end := time.Now()
	s.counts[k][o].Add(1)
	lat := int64(end.Sub(start))
	for {
		m := s.maxLat[k].Load()
		if lat <= m || s.maxLat[k].CompareAndSwap(m, lat) {
			break
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o != OK {
		msg := detail
		if err != nil {
			msg = err.Error()
			if detail != "" {
				msg = detail + ": " + msg
			}
		}
		if o == WrongBytes || o == LostAck {
			s.examples = append(s.examples, fmt.Sprintf("[+%.1fs, %s] %s: %s: %s", end.Sub(s.t0).Seconds(), s.label, k, o, msg))
		}
		// Group messages that differ only in numbers (ids, offsets, ports).
		msg = digits.ReplaceAllString(msg, "N")
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		key := k.String() + " | " + o.String() + " | " + msg
		if s.errSample[key] == 0 {
			s.errFirst[key] = s.label
		}
		s.errSample[key]++
	}
	if !s.faultAt.IsZero() && s.healAt.IsZero() && o != OK && o != Miss && start.After(s.faultAt) {
		s.duringBad[k]++
	}
	if o == OK && !s.healAt.IsZero() && start.After(s.healAt) && s.recovered[k] < 0 {
		s.recovered[k] = end.Sub(s.healAt)
	}
}

func (s *Stats) addVerified(n int) { s.verified.Add(int64(n)) }

// faultStart marks the start of a fault.
func (s *Stats) faultStart(label string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.label = "during " + label
	s.faultAt, s.healAt = time.Now(), time.Time{}
	s.duringBad = [nKinds]int{}
}

// healed marks the end of a fault and starts measuring recovery.
func (s *Stats) healed() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.healAt = time.Now()
	s.label = strings.Replace(s.label, "during ", "after ", 1)
	for i := range s.recovered {
		s.recovered[i] = -1
	}
	return s.healAt
}

// recovery returns, for each kind, the time from the heal to the end of
// its first successful operation that started after it (-1: none yet),
// and the failed operations during the fault.
func (s *Stats) recovery() ([nKinds]time.Duration, [nKinds]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recovered, s.duringBad
}

func (s *Stats) violations() int64 {
	var n int64
	for k := range nKinds {
		n += s.counts[k][WrongBytes].Load() + s.counts[k][LostAck].Load()
	}
	return n
}

// topErrors returns the n most frequent error messages, most frequent
// first, then the most frequent message of each kind and outcome that is
// not among them, so that a rare failure (one session turn among hundreds
// of KV misses) is named too. Each row: kind, outcome, message, count, and
// the fault it was first seen in.
func (s *Stats) topErrors(n int) [][5]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, c := range s.errSample {
		all = append(all, kv{k, c})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].k < all[j].k })
	var out [][5]string
	shown := map[string]bool{} // "kind | outcome"
	for i, e := range all {
		f := strings.SplitN(e.k, " | ", 3) // kind and outcome have no " | "
		if i >= n && shown[f[0]+" | "+f[1]] {
			continue
		}
		shown[f[0]+" | "+f[1]] = true
		out = append(out, [5]string{f[0], f[1], strings.ReplaceAll(f[2], "\n", " "), itoa(e.n), s.errFirst[e.k]})
	}
	return out
}

// restartClock makes the times of violations count from now (the start of
// the schedule, as the printed timeline does).
func (s *Stats) restartClock(t time.Time) {
	s.mu.Lock()
	s.t0 = t
	s.mu.Unlock()
}
