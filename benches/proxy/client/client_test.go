package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestServerTimingReadsOverheadOnly(t *testing.T) {
	cases := map[string]float64{
		"":                                    -1,
		"overhead;dur=0.42":                   0.42,
		"upstream;dur=12.5, overhead;dur=1.5": 1.5,
		"overhead;desc=\"gateway\";dur=2":     2,
		"overheads;dur=3":                     -1,
		"overhead;dur=x":                      -1,
	}
	for header, want := range cases {
		if got := serverTiming(header); got != want {
			t.Errorf("serverTiming(%q) = %v, want %v", header, got, want)
		}
	}
}

func TestStatsNearestRank(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100 down to 1, unsorted on purpose
	}
	s := stats(xs, 50, 99, 100)
	if s["p50"] != 50 || s["p99"] != 99 || s["max"] != 100 || s["n"] != 100 {
		t.Errorf("stats = %v", s)
	}
	if stats(nil, 50) != nil {
		t.Error("no samples should give no stats")
	}
}

// The gateway's own overhead figure is read from the header, the body, or the last
// stream chunk that carries timings; content deltas are counted, empty ones are not.
func TestOverheadFromHeaderBodyAndStream(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("kind") {
		case "header":
			w.Header().Set("Server-Timing", "overhead;dur=0.7")
			fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}]}`)
		case "body":
			fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}],"timings":{"overhead_ms":0.3}}`)
		default:
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
			for i := 0; i < 3; i++ {
				fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
			}
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{},\"timings\":{\"overhead_ms\":0.25}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		}
	}))
	defer srv.Close()

	for kind, want := range map[string]float64{"header": 0.7, "body": 0.3} {
		r := options{}.doAt(srv.Client(), srv.URL+"/chat/completions?kind="+kind, []byte("{}"))
		if r.err != "" || r.overhead != want {
			t.Errorf("%s: err %q, overhead %v, want %v", kind, r.err, r.overhead, want)
		}
	}
	o := options{stream: true, deltas: 3}
	r := o.doAt(srv.Client(), srv.URL+"/chat/completions?kind=stream", []byte("{}"))
	if r.err != "" || r.frames != 3 || len(r.gaps) != 2 || r.overhead != 0.25 {
		t.Errorf("stream: err %q, frames %d, gaps %d, overhead %v", r.err, r.frames, len(r.gaps), r.overhead)
	}
}
