package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// Exit statuses a script can rely on (docs/cli.md, "Exit status"):
//
//	0  success
//	1  the command ran and failed (the message says why), or, for the
//	   commands that answer a question (kv exists), the answer is no
//	2  bad usage (unknown flag, wrong arguments), or kv exists could not
//	   ask
const (
	exitFailure = 1
	exitUsage   = 2
)

// exitError carries the status main exits with; silent ones print nothing
// (the command already said what there was to say).
type exitError struct {
	code   int
	err    error
	silent bool
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usage marks err as a usage error.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: exitUsage, err: err}
}

// markUsageErrors makes argument and flag errors of every command exit
// with exitUsage.
func markUsageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error { return usage(args(cmd, a)) }
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// exit prints err (unless it is silent) and exits with its status.
func exit(err error) {
	code := exitFailure
	var e *exitError
	if errors.As(err, &e) {
		code = e.code
		if e.silent {
			os.Exit(code)
		}
	}
	fmt.Fprintln(os.Stderr, "gd2fs:", err)
	os.Exit(code)
}
