package kvstore

import (
	"fmt"
	"testing"
)

// TestScanGuarantee: while keys come and go during a scan, every key
// present for the whole scan is returned exactly once, and keys of other
// prefixes (pools) never appear.
func TestScanGuarantee(t *testing.T) {
	s, err := Open(Config{MemBytes: 64 << 20}) // room for every key: nothing is evicted
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 1000; i++ {
		s.Put([]byte(fmt.Sprintf("perf\x00k%d", i)), []byte("v"), false)
		s.Put([]byte(fmt.Sprintf("ha\x00k%d", i)), []byte("v"), false)
	}
	seen := map[string]int{}
	cursor, calls := uint64(0), 0
	for {
		keys, next, total := s.Scan([]byte("perf\x00"), cursor, 7)
		if total < 500 || total > 1500 {
			t.Fatalf("total %d", total)
		}
		for _, k := range keys {
			seen[k]++
		}
		// Churn: odd keys go, new keys come.
		s.Delete([]byte(fmt.Sprintf("perf\x00k%d", 2*calls+1)))
		s.Put([]byte(fmt.Sprintf("perf\x00new%d", calls)), []byte("v"), false)
		calls++
		if next == 0 {
			break
		}
		cursor = next
	}
	for i := 0; i < 1000; i += 2 {
		if n := seen[fmt.Sprintf("k%d", i)]; n != 1 {
			t.Errorf("k%d returned %d times", i, n)
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s returned %d times", k, n)
		}
	}
}
