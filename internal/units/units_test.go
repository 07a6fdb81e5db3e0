package units

import (
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "123": 123, "64KiB": 64 << 10, "16MiB": 16 << 20, " 8 GiB ": 8 << 30, "2TiB": 2 << 40,
		"1KB": 1000, "1MB": 1e6, "3GB": 3e9, "1TB": 1e12, "4k": 4 << 10, "1.5M": 3 << 19, "512b": 512, "2g": 2 << 30,
		"7TiB": 7 << 40,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	// Bad input is an error that says what to write, never a wrapped or
	// garbage number.
	for _, in := range []string{"", "MiB", "-1", "-1KiB", "1 2", "12XB", "NaN", "Inf", "+Inf", "1e30TiB", "9EiB", "9223372036854775808"} {
		got, err := ParseSize(in)
		if err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		} else if !strings.Contains(err.Error(), "e.g.") {
			t.Errorf("ParseSize(%q): %v does not say what to write", in, err)
		}
	}
}

func TestHuman(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 64 << 20: "64.0 MiB",
		3 << 30: "3.0 GiB", 1 << 40: "1.0 TiB", 1 << 50: "1.0 PiB", math.MaxInt64: "8.0 EiB",
	} {
		if got := Human(n); got != want {
			t.Errorf("Human(%d) = %q, want %q", n, got, want)
		}
	}
}
