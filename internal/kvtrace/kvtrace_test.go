package kvtrace

import (
	"fmt"
	"testing"
)

func TestExplore(t *testing.T) {
	g := DefaultGen()
	g.Requests = 6000
	reqs := Generate(g)
	d := Distinct(reqs)
	for _, f := range []float64{0.10, 0.25} {
		c := int(float64(d) * f)
		l, b := LRU(reqs, c), Belady(reqs, c)
		s, err := Store(reqs, c, 16<<10)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("distinct %d cap %d: lru %.4f belady %.4f gd2fs %.4f (x%.3f) %v\n", d, c, l.Ratio(), b.Ratio(), s.Ratio(), s.Ratio()/l.Ratio(), s.Elapsed)
		fmt.Printf("%+v\n", s.Stats)
	}
}

func BenchmarkStoreSmall(b *testing.B) {
	c := DefaultGen()
	c.Requests = 2000
	reqs := Generate(c)
	for i := 0; i < b.N; i++ {
		Store(reqs, Distinct(reqs)/10, 16<<10)
	}
}
