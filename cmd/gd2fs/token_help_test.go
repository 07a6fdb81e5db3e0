package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelpHidesToken: GD2FS_TOKEN is never printed by --help as a flag's
// default (issue 22 finding 11), and is still the token.
func TestHelpHidesToken(t *testing.T) {
	const secret = "s3cr3t-t0ken-value"
	t.Setenv("GD2FS_TOKEN", secret)
	for _, args := range [][]string{{"status", "--help"}, {"--help"}, {"master", "--help"}, {"kv", "put", "--help"}} {
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if strings.Contains(out.String(), secret) {
			t.Fatalf("gd2fs %s prints the token:\n%s", strings.Join(args, " "), out.String())
		}
	}
	g := &globals{}
	if err := g.resolve(); err != nil || g.token != secret {
		t.Fatalf("the variable is not the token: %q %v", g.token, err)
	}
}
