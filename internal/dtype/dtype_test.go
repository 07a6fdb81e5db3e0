package dtype

import "testing"

func TestSize(t *testing.T) {
	for name, want := range map[string]int{"bf16": 2, "fp8": 1, "fp32": 4, "BF16": 2, "F64": 8, "BOOL": 1, "F8_E5M2": 1, "": 0, "bf17": 0, "Bf16": 0} {
		if got := Size(name); got != want {
			t.Errorf("Size(%q) = %d, want %d", name, got, want)
		}
	}
}
