package meta

import (
	"fmt"
	"os"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// Numeric checks of layouts, plans and prefixes, kept apart from the SQL of
// sessions.go: every figure a request carries is compared with its maximum
// (package limits) before it is multiplied into a byte count.

// checkTokens bounds a token count of a prefix or plan.
func checkTokens(what string, n int64) error {
	if n < 0 || n > limits.MaxTokens {
		return errs.New(errs.ErrBadRequest, "%s of %d: must be between 0 and %d", what, n, limits.MaxTokens)
	}
	return nil
}

// checkPlanInput bounds the token counts of a plan one by one (their sum
// cannot then overflow) and together.
func checkPlanInput(in PlanInput) error {
	if err := checkTokens("prompt_tokens", in.PromptTokens); err != nil {
		return err
	}
	if err := checkTokens("decode_tokens", in.DecodeTokens); err != nil {
		return err
	}
	if in.PromptTokens < 1 || in.PromptTokens+in.DecodeTokens > limits.MaxTokens {
		return errs.New(errs.ErrBadRequest, "prompt_tokens must be at least 1 and prompt+decode at most %d (got %d + %d)", limits.MaxTokens, in.PromptTokens, in.DecodeTokens)
	}
	return checkPlanContent(in)
}

// checkPlanContent: a plan says what its prompt is, by token ids or by block
// hashes, or asks explicitly to be planned on counts alone (content.go).
func checkPlanContent(in PlanInput) error {
	ids, hashes := len(in.TokenIDs) > 0, len(in.BlockHashes) > 0
	switch {
	case in.UnsafeCountOnly && (ids || hashes):
		return errs.New(errs.ErrBadRequest, "plan of session %s: unsafe_count_only with token_ids or block_hashes; drop unsafe_count_only so the content is checked", in.Session)
	case in.UnsafeCountOnly:
		return nil
	case ids && hashes:
		return errs.New(errs.ErrBadRequest, "plan of session %s: give token_ids or block_hashes, not both", in.Session)
	case ids && int64(len(in.TokenIDs)) != in.PromptTokens:
		return errs.New(errs.ErrBadRequest, "plan of session %s: %d token_ids for prompt_tokens %d; send the ids of the whole prompt (prompt_tokens may be left out)",
			in.Session, len(in.TokenIDs), in.PromptTokens)
	case !ids && !hashes:
		return errs.New(errs.ErrBadRequest, "plan of session %s names no prompt content: send the prompt's token_ids (or its block_hashes, "+
			"kvlayout.BlockHashes in the layout's page_tokens) so stored KV is used only for the tokens it was computed from; "+
			"unsafe_count_only: true plans on counts alone, which serves wrong KV after a user edits an earlier message", in.Session)
	}
	return nil
}

// CheckSize bounds a file size given in a request (commit, link).
func CheckSize(size int64) error {
	if size < 0 || size > limits.MaxFileSize {
		return errs.New(errs.ErrBadRequest, "size %d: must be between 0 and %d bytes", size, int64(limits.MaxFileSize))
	}
	return nil
}

// createPrivate creates the SQLite file readable by its owner only before
// SQLite opens it (SQLite gives its -wal and -shm files the same mode), and
// tightens an existing one: metadata names every file of the cluster.
func createPrivate(file string) error {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("meta: create %s: %w", file, err)
	}
	f.Close()
	return os.Chmod(file, 0o600)
}
