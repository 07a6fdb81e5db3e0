package errs

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestCause: an error made with %w keeps its cause for errors.Is and
// errors.As beside its kind, and its kind alone decides its code.
func TestCause(t *testing.T) {
	err := New(ErrUnavailable, "server x: %w", context.DeadlineExceeded)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("errors.Is lost the kind or the cause: %v", err)
	}
	if err.Error() != "server x: context deadline exceeded" {
		t.Fatalf("message %q", err.Error())
	}
	// A cause of another kind: both are visible, the outer kind names it.
	inner := New(ErrNotFound, "no chunk 7")
	outer := fmt.Errorf("read: %w", New(ErrUnavailable, "no replica answered (last error: %w)", inner))
	if !errors.Is(outer, ErrUnavailable) || !errors.Is(outer, ErrNotFound) {
		t.Fatal("errors.Is lost a kind")
	}
	if KindOf(outer) != ErrUnavailable || Code(outer) != "unavailable" {
		t.Fatalf("kind %v, code %s; want unavailable", KindOf(outer), Code(outer))
	}
	var e *Error
	if !errors.As(outer, &e) || e.Kind != ErrUnavailable || e.Cause != inner {
		t.Fatalf("errors.As: %+v", e)
	}
	// Two causes.
	two := New(ErrInternal, "%w and %w", context.Canceled, ErrChecksum)
	if !errors.Is(two, context.Canceled) || !errors.Is(two, ErrChecksum) || Code(two) != "internal" {
		t.Fatal("two causes")
	}
	// No cause: %v formats without wrapping.
	plain := New(ErrBadRequest, "bad %v", context.Canceled)
	if errors.Is(plain, context.Canceled) || plain.(*Error).Cause != nil {
		t.Fatal("a verb-v argument became a cause")
	}
	// Bare sentinels and foreign errors.
	if Code(fmt.Errorf("x: %w", ErrSealed)) != "sealed" || Code(errors.New("boom")) != "internal" || KindOf(nil) != nil {
		t.Fatal("codes of bare errors")
	}
	if FromCode("not_found", "m").(*Error).Kind != ErrNotFound {
		t.Fatal("FromCode")
	}
}
