package placement

import (
	"fmt"
	"testing"
)

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("server-%d", i), Addr: fmt.Sprintf("127.0.0.1:%d", 7071+i)}
	}
	return ms
}

func TestBalanceAndMovement(t *testing.T) {
	const keys = 20000
	four, five := members(4), members(5)
	count := map[string]int{}
	moved := 0
	for i := 0; i < keys; i++ {
		k := []byte(fmt.Sprintf("model/rank0/%016x", i))
		a := Owners(k, four, 1)[0]
		b := Owners(k, five, 1)[0]
		count[a.ID]++
		if a.ID != b.ID {
			moved++
			if b.ID != "server-4" {
				t.Fatalf("key moved between old servers: %s -> %s", a.ID, b.ID)
			}
		}
	}
	for id, c := range count {
		if c < keys/4*85/100 || c > keys/4*115/100 {
			t.Errorf("%s owns %d of %d keys: unbalanced", id, c, keys)
		}
	}
	// Adding a 5th server moves about 1/5 of the keys.
	if moved < keys/5*80/100 || moved > keys/5*120/100 {
		t.Errorf("adding a server moved %d of %d keys, want about %d", moved, keys, keys/5)
	}
}

func TestOwnersDistinctAndStable(t *testing.T) {
	ms := members(5)
	o := Owners([]byte("k"), ms, 3)
	if len(o) != 3 || o[0].ID == o[1].ID || o[1].ID == o[2].ID || o[0].ID == o[2].ID {
		t.Fatalf("owners %+v", o)
	}
	rev := append([]Member(nil), ms...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	if o2 := Owners([]byte("k"), rev, 3); o2[0] != o[0] || o2[2] != o[2] {
		t.Fatal("owners depend on member order")
	}
	if !Owns([]byte("k"), ms, 3, o[2].ID) || Owns([]byte("k"), ms, 2, o[2].ID) {
		t.Fatal("Owns disagrees with Owners")
	}
	if len(Owners([]byte("k"), ms[:2], 3)) != 2 {
		t.Fatal("fewer members than replicas")
	}
}

// TestWeighted: picks are distinct, repeatable, and spread in proportion to
// free space.
func TestWeighted(t *testing.T) {
	cands := []Candidate{{"a", 1 << 30}, {"b", 1 << 30}, {"c", 2 << 30}, {"d", 0}}
	wins := map[string]int{}
	for i := 0; i < 20000; i++ {
		key := []byte(fmt.Sprintf("%d/%d", i/7, i%7))
		got := Weighted(key, cands, 2)
		if len(got) != 2 || got[0] == got[1] {
			t.Fatalf("key %s: %v", key, got)
		}
		if again := Weighted(key, cands, 2); again[0] != got[0] || again[1] != got[1] {
			t.Fatalf("key %s: %v then %v", key, got, again)
		}
		wins[got[0]]++
	}
	// c has half the free space: it should win about half the first picks.
	if wins["d"] != 0 || wins["c"] < 9000 || wins["c"] > 11000 || wins["a"] < 4000 || wins["b"] < 4000 {
		t.Fatalf("first picks %v", wins)
	}
	if got := Weighted([]byte("k"), cands, 9); len(got) != 4 || got[3] != "d" {
		t.Fatalf("all candidates, empty last: %v", got)
	}
}
