//! The language a text is written in (the prompt's and the answer's), for the semantic
//! log (refusals and intents by language in Kibana, answers in another language than
//! their prompt): whatlang's trigram and script detection on its first characters,
//! as an ISO 639-3 code (`eng`, `cmn`, `jpn`...), or `und` when the text is too short or
//! mixed to tell reliably.

/// Characters looked at: enough to tell, little enough to stay off the request path.
const SAMPLE_CHARS: usize = 400;

/// ISO 639-3 code of "undetermined".
pub const UNDETERMINED: &str = "und";

pub fn language_of(text: &str) -> &'static str {
    let sample = text
        .char_indices()
        .nth(SAMPLE_CHARS)
        .map_or(text, |(i, _)| &text[..i]);
    match whatlang::detect(sample) {
        Some(info) if info.is_reliable() => info.lang().code(),
        _ => UNDETERMINED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_of_the_prompt_sets() {
        let cases = [
            ("What is the capital of France and why is it famous?", "eng"),
            (
                "Quelle est la capitale de la France et pourquoi est-elle célèbre ?",
                "fra",
            ),
            (
                "Was ist die Hauptstadt von Frankreich und warum ist sie berühmt?",
                "deu",
            ),
            ("法国的首都是哪里？为什么它很有名？", "cmn"),
            ("フランスの首都はどこですか？なぜ有名なのですか？", "jpn"),
            ("ok", UNDETERMINED),
            ("", UNDETERMINED),
        ];
        for (text, code) in cases {
            assert_eq!(language_of(text), code, "{text}");
        }
    }
}
