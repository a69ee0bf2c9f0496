//! A sequence's bytes as text, as its tokens arrive: a token may end inside a
//! character (an accented letter, an emoji split over byte tokens), so what does not
//! complete a character waits for the tokens that do.

/// The bytes of a sequence's tokens not yet handed on as text.
#[derive(Debug, Default)]
pub(super) struct Pieces {
    pending: Vec<u8>,
}

impl Pieces {
    /// The text `bytes` complete, with what waited before them; an incomplete character
    /// at the end waits for the next token. Bytes that can never be UTF-8 become U+FFFD.
    pub(super) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut complete = 0;
        loop {
            match std::str::from_utf8(&self.pending[complete..]) {
                Ok(_) => {
                    complete = self.pending.len();
                    break;
                }
                // Bytes that start no character: past them, and on.
                Err(e) if e.error_len().is_some() => {
                    complete += e.valid_up_to() + e.error_len().unwrap_or(1);
                }
                // A character still arriving at the end.
                Err(e) => {
                    complete += e.valid_up_to();
                    break;
                }
            }
        }
        let text = String::from_utf8_lossy(&self.pending[..complete]).into_owned();
        self.pending.drain(..complete);
        text
    }

    /// What is left at the sequence's end, however incomplete.
    pub(super) fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_over_tokens_waits_for_its_last_byte() {
        let mut pieces = Pieces::default();
        let e_acute = "é".as_bytes();
        assert_eq!(pieces.push(b"caf"), "caf");
        assert_eq!(pieces.push(&e_acute[..1]), "", "half a character waits");
        assert_eq!(pieces.push(&e_acute[1..]), "é");
        let emoji = "🦀".as_bytes();
        assert_eq!(pieces.push(&emoji[..3]), "");
        assert_eq!(pieces.push(&[emoji[3], b'!']), "🦀!");
        // A byte that starts no character is replaced, not held for ever, and a
        // character begun after it still waits.
        assert_eq!(pieces.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(pieces.push(&[0xff, e_acute[0]]), "\u{fffd}");
        assert_eq!(pieces.push(&e_acute[1..]), "é");
        assert_eq!(pieces.push(&emoji[..2]), "");
        assert_eq!(pieces.finish(), "\u{fffd}", "the end hands on what is left");
    }
}
