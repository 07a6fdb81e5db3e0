// Package placement computes the owners of a KV key from the membership map
// by rendezvous (highest random weight) hashing. Clients and servers run the
// same function, so no master round trip is needed per operation, and adding
// or removing one of N servers moves about 1/N of the keys.
package placement

import "sort"

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
