package postmark

import (
	"os"
	"testing"
)

// Postmark 1.51's verbose report, as Debian's postmark prints it.
const pmSample = `PostMark v1.51 : 8/14/01
pm>pm>Creating files...Done
Performing transactions..........Done
Deleting files...Done
Time:
	21 seconds total
	17 seconds of transactions (294 per second)

Files:
	3531 created (168 per second)
		Creation alone: 1000 files (500 per second)
		Mixed with transactions: 2531 files (148 per second)
	2510 read (147 per second)
	2486 appended (146 per second)

Data:
	48.91 megabytes read (2.33 megabytes per second)
	71.07 megabytes written (3.38 megabytes per second)
pm>`

func TestParsePostmark(t *testing.T) {
	r, err := parsePostmark([]byte(pmSample))
	if err != nil {
		t.Fatal(err)
	}
	if want := (pmReport{total: 21, txRate: 294, reads: 2510}); r != want {
		t.Fatalf("got %+v, want %+v", r, want)
	}
	if _, err := parsePostmark([]byte("out of files!\n")); err == nil {
		t.Fatal("no error for a run without a report")
	}
}

func TestPostmarkLoop(t *testing.T) {
	dir := t.TempDir()
	w := Workload{Files: 50, Tx: 300, ReadBias: 5, CreateBias: 5}
	r, err := postmarkLoop(osDir(dir), w)
	if err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("%d files left", len(left))
	}
	if r.n[opCreate] != r.n[opDelete] || r.n[opCreate] != r.n[opCloseWrite]-r.n[opAppend] {
		t.Fatalf("unbalanced operations: %v", r.n)
	}
	if got := r.n[opRead] + r.n[opAppend]; got == 0 || got > w.Tx {
		t.Fatalf("%d reads and appends in %d transactions", got, w.Tx)
	}
	again, err := postmarkLoop(osDir(dir), w)
	if err != nil {
		t.Fatal(err)
	}
	if again.n != r.n {
		t.Fatalf("same seed, other operations: %v, then %v", r.n, again.n)
	}
}
