//! Stop sequences, applied by the gateway to the text as the engine produces it.
//!
//! OpenAI's rule: the answer ends where a stop sequence begins, and the sequence itself is
//! not returned. mistral.rs 0.8.1 does not keep it in streaming mode (it checks the text
//! before adding the new token, so it stops one token late and sends the stop sequence;
//! a stop that is one token is matched by id, so `"Paris"` never stops `" Paris"`). The
//! screen here holds back any end of the text that could still become a stop sequence,
//! cuts the text where one is complete, and lets everything else through at once.

use std::borrow::Cow;

/// The stop sequences of one request and the text held back for them.
#[derive(Debug, Default)]
pub struct StopScreen {
    stops: Vec<String>,
    held: String,
    /// The stop sequence that ended the answer, once one has.
    matched: Option<String>,
}

/// What the screen lets through for one piece of engine text.
#[derive(Debug, PartialEq, Eq)]
pub struct Screened<'a> {
    /// Text the client may have now: the piece itself when the request has no stops.
    pub text: Cow<'a, str>,
    /// A stop sequence is complete: the answer ends after `text`.
    pub stopped: bool,
}

impl StopScreen {
    /// Forgets what it holds: the answer starts over.
    pub fn restart(&mut self) {
        self.held.clear();
        self.matched = None;
    }

    /// The stop sequence that ended the answer, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Empty sequences are ignored (they would end every answer before it began).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Adds a piece of engine text.
    pub fn push<'a>(&mut self, piece: &'a str) -> Screened<'a> {
        if self.stops.is_empty() {
            return Screened {
                text: Cow::Borrowed(piece),
                stopped: false,
            };
        }
        self.held.push_str(piece);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| Some((self.held.find(s.as_str())?, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = first_stop {
            self.matched = Some(stop.clone());
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return Screened {
                text: Cow::Owned(text),
                stopped: true,
            };
        }
        let keep = self.partial_stop_len();
        let text = self.held.drain(..self.held.len() - keep).collect();
        Screened {
            text: Cow::Owned(text),
            stopped: false,
        }
    }

    /// The engine has finished: what was held back is answer text after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of the held text that are the start of some stop sequence (the
    /// longest such end), which must wait for the next piece.
    fn partial_stop_len(&self) -> usize {
        let held = self.held.as_str();
        self.stops
            .iter()
            .filter_map(|stop| {
                // Proper prefixes only: a whole stop sequence was found above.
                (1..stop.len().min(held.len() + 1))
                    .rev()
                    .filter(|&n| stop.is_char_boundary(n))
                    .find(|&n| held.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn screen(stops: &[&str]) -> StopScreen {
        StopScreen::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = screen(stops);
        let mut out = String::new();
        for piece in pieces {
            let screened = s.push(piece);
            out.push_str(&screened.text);
            if screened.stopped {
                return (out, true);
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn the_answer_ends_where_a_stop_sequence_begins() {
        assert_eq!(
            run(&["!"], &["Hello", " there", "!", " How"]),
            ("Hello there".into(), true)
        );
        assert_eq!(
            run(&[" there"], &["Hello", " there", "!"]),
            ("Hello".into(), true)
        );
        assert_eq!(
            run(&["Paris"], &[" Paris", "."]),
            (" ".into(), true),
            "inside a token"
        );
        assert_eq!(
            run(&["\n\n"], &["a\n", "\nb"]),
            ("a".into(), true),
            "across tokens"
        );
        assert_eq!(
            run(&["c", "b"], &["abc"]),
            ("a".into(), true),
            "the earliest wins"
        );
    }

    #[test]
    fn a_possible_start_is_held_back_and_let_go_when_it_is_not_one() {
        let mut s = screen(&["END"]);
        assert_eq!(s.push("The E").text, "The ", "'E' may begin END");
        assert_eq!(s.push("N").text, "", "'EN' still may");
        let cut = s.push("D");
        assert_eq!((cut.text.as_ref(), cut.stopped), ("", true), "END: cut");
        let mut s = screen(&["END"]);
        s.push("The EN");
        assert_eq!(s.push("velope").text, "ENvelope", "not a stop after all");
        s.push("E");
        assert_eq!(
            s.finish(),
            "E",
            "the engine finished: the held text is the answer's"
        );
    }

    #[test]
    fn without_stops_text_passes_unchanged_and_multibyte_prefixes_are_respected() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(
            run(&[""], &["a"]),
            ("a".into(), false),
            "an empty stop is none"
        );
        let mut s = screen(&["éa"]);
        assert_eq!(s.push("caf").text, "caf");
        assert_eq!(s.push("é").text, "", "é may begin éa");
        assert_eq!(s.push("!").text, "é!");
    }
}
