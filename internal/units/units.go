// Package units reads and writes byte sizes for the command-line tools.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize reads 123, 64KiB, 16MiB, 8GiB, 2TiB (and KB/MB/GB/TB as powers of 10).
func ParseSize(s string) (int64, error) {
	table := []struct {
		suf  string
		mult int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}}
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range table {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suf)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suf)]), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	// NaN, infinities and sizes past int64 are refused before converting:
	// int64 of them is not a size (it came out negative).
	if err != nil || !(f >= 0) || f*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q: write a number with an optional unit, e.g. 512MiB or 2TiB", s)
	}
	return int64(f * float64(mult)), nil
}

// Human writes n bytes in binary units, e.g. 1.5 GiB.
func Human(n int64) string {
	const u = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, i := float64(n), -1
	for f >= 1024 && i < len(u)-1 {
		f /= 1024
		i++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + string(u[i]) + "iB"
}
