package master

import (
	"math"
	"reflect"
	"testing"

	"github.com/gd2fs/gd2fs/internal/meta"
)

// TestSpans: ranges of a file that reach a common chunk become one span
// (each chunk is asked about once); bad ranges keep spans of their own,
// which newHeldFile refuses; a file that cannot be read has none.
func TestSpans(t *testing.T) {
	r := func(p string, s, n int64) meta.Range { return meta.Range{Path: p, KVStart: s, KVLength: n} }
	got := spans([]meta.Range{
		r("/a", 300, 50), r("/a", 0, 40), r("/a", 50, 10), // chunk 3; chunk 0 twice (100-byte chunks)
		r("/a", 250, 10), r("/a", 290, 20), // chunk 2, and 2 to 3: joins 300's span
		r("/b", 0, 10),                                              // an unreadable file
		r("/c", 5, 0), r("/c", 0, 10), r("/c", math.MaxInt64-5, 10), // bad ranges
	}, func(p string) int64 {
		if p == "/b" {
			return 0
		}
		return 100
	})
	want := []meta.Range{r("/a", 0, 60), r("/a", 250, 100), r("/c", 0, 10), r("/c", 5, 0), r("/c", math.MaxInt64-5, 10)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("spans:\n got %v\nwant %v", got, want)
	}
}
