package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelp: every benchmark has --help with an example.
func TestHelp(t *testing.T) {
	for _, sub := range newRoot().Commands() {
		if sub.Name() == "help" || sub.Name() == "completion" {
			continue
		}
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{sub.Name(), "--help"})
		if err := root.Execute(); err != nil || !strings.Contains(out.String(), "Example") {
			t.Errorf("gd2fs-bench %s --help: %v, no example in\n%s", sub.Name(), err, out.String())
		}
	}
}
