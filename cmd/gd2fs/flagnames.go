package main

import (
	"strings"
)

// apiFields are the master's API field names in error messages and the CLI
// flags that set them: the master speaks JSON, but a CLI user should read
// the flag to change.
var apiFields = []struct{ field, flag string }{
	{"plan needs a model", "plan needs a model: give --model"},
	{"prompt_tokens", "--prompt-tokens"},
	{"decode_tokens", "--decode-tokens"},
	{"load_threshold", "--load-threshold"},
	{"page_tokens", "--page-tokens"},
	{"kv_heads", "--kv-heads"},
	{"head_dim", "--head-dim"},
	{"tp_size", "--tp-size"},
	{"use a pool with fewer replicas", "use a pool with fewer replicas (--pool perf keeps one copy)"},
}

// flagError rewrites an error from the master in terms of the CLI's flags;
// errors.Is still sees the original (it is wrapped).
func flagError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	out := msg
	for _, f := range apiFields {
		out = strings.ReplaceAll(out, f.field, f.flag)
	}
	if out == msg {
		return err
	}
	return &rewordedError{msg: out, err: err}
}

type rewordedError struct {
	msg string
	err error
}

func (e *rewordedError) Error() string { return e.msg }
func (e *rewordedError) Unwrap() error { return e.err }
