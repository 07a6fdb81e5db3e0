// Package placement is the one placement hash of gd2fs: rendezvous (highest
// random weight) hashing. Owners computes the owners of a KV key from the
// membership map; clients and servers run the same function, so no master
// round trip is needed per operation, and adding or removing one of N
// servers moves about 1/N of the keys. Weighted is the master's choice of
// servers for a file chunk, weighted by free space.
package placement

import (
	"math"
	"sort"
)

// Member is one server in the membership map.
type Member struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// fnv64a hashes b; deterministic across processes (unlike hash/maphash).
func fnv64a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// mix is the splitmix64 finaliser: it spreads a combined hash over all bits.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Owners returns the n members with the highest weight for key, best first.
// With fewer than n members it returns them all.
func Owners(key []byte, members []Member, n int) []Member {
	kh := fnv64a(key)
	type scored struct {
		m Member
		w uint64
	}
	ss := make([]scored, len(members))
	for i, m := range members {
		ss[i] = scored{m, mix(kh ^ fnv64a([]byte(m.ID)))}
	}
	sort.Slice(ss, func(i, j int) bool {
		if ss[i].w != ss[j].w {
			return ss[i].w > ss[j].w
		}
		return ss[i].m.ID < ss[j].m.ID
	})
	n = min(n, len(ss))
	out := make([]Member, n)
	for i := range out {
		out[i] = ss[i].m
	}
	return out
}

// Owns reports whether member id is among the n owners of key.
func Owns(key []byte, members []Member, n int, id string) bool {
	for _, m := range Owners(key, members, n) {
		if m.ID == id {
			return true
		}
	}
	return false
}

// Candidate is a server chunk placement may choose, weighted by its free
// bytes.
type Candidate struct {
	ID   string
	Free int64
}

// Weighted picks the n candidates with the lowest score -ln(u)/free for key,
// best first, where u in (0, 1) is the same per-(key, member) hash Owners
// uses: weighted rendezvous hashing. Each candidate wins in proportion to
// its free space, and the choice depends only on key and the candidates, so
// every master (and every restart) makes the same one. Candidates with no
// free space come last. With fewer than n candidates it returns them all.
func Weighted(key []byte, cands []Candidate, n int) []string {
	kh := fnv64a(key)
	type scored struct {
		id    string
		score float64
	}
	ss := make([]scored, 0, len(cands))
	for _, c := range cands {
		score := math.Inf(1)
		if c.Free > 0 {
			u := (float64(mix(kh^fnv64a([]byte(c.ID)))>>11) + 0.5) / (1 << 53)
			score = -math.Log(u) / float64(c.Free)
		}
		ss = append(ss, scored{c.ID, score})
	}
	sort.Slice(ss, func(i, j int) bool {
		if ss[i].score != ss[j].score {
			return ss[i].score < ss[j].score
		}
		return ss[i].id < ss[j].id
	})
	n = min(n, len(ss))
	out := make([]string, n)
	for i := range out {
		out[i] = ss[i].id
	}
	return out
}
