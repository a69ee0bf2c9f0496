//! Intent classification from rules: an ordered list of (label, regex patterns), read
//! from a TOML file (`prompts/intents.toml` by default). The first rule with a pattern
//! that matches the last user message wins; no match is `general`.

use regex::RegexSetBuilder;
use serde::Deserialize;

pub const DEFAULT_INTENT: &str = "general";
/// The rules shipped in `prompts/intents.toml`, built in so the binary works anywhere.
pub const DEFAULT_RULES: &str = include_str!("../../prompts/intents.toml");

#[derive(Debug, Deserialize)]
struct RulesFile {
    intent: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
struct Rule {
    label: String,
    patterns: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct IntentClassifier {
    set: regex::RegexSet,
    /// Label of each pattern in the set, in rule order.
    labels: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum IntentRulesError {
    #[error("the intent rules are not valid TOML: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("an intent pattern does not compile: {0}")]
    Regex(#[from] regex::Error),
}

impl IntentClassifier {
    pub fn from_toml(text: &str) -> Result<Self, IntentRulesError> {
        let file: RulesFile = toml::from_str(text)?;
        let mut patterns = Vec::new();
        let mut labels = Vec::new();
        for rule in file.intent {
            for pattern in rule.patterns {
                patterns.push(pattern);
                labels.push(rule.label.clone());
            }
        }
        let set = RegexSetBuilder::new(&patterns)
            .case_insensitive(true)
            .build()?;
        Ok(Self { set, labels })
    }

    pub fn with_defaults() -> Self {
        Self::from_toml(DEFAULT_RULES)
            .unwrap_or_else(|e| unreachable!("the shipped rules are valid: {e}"))
    }

    /// The intent of `text`.
    pub fn classify(&self, text: &str) -> &str {
        self.set
            .matches(text)
            .iter()
            .next()
            .map_or(DEFAULT_INTENT, |i| self.labels[i].as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_rules_table() {
        let c = IntentClassifier::with_defaults();
        let cases = [
            ("Write a Python function that reverses a list", "coding"),
            ("Why does my Rust code not compile?", "coding"),
            ("Solve the equation 2x + 3 = 7", "math"),
            ("What is 17 * 23", "math"),
            (
                "A train travels 120 km in 1.5 hours. Show the calculation.",
                "math",
            ),
            ("Translate 'good morning' into French", "translation"),
            ("Summarize this article in three sentences", "summarization"),
            ("Write a poem about the sea", "creative_writing"),
            ("What is the capital of France?", "factual_qa"),
            ("Hello there", "greeting"),
            ("Hello, what is the capital of France?", "factual_qa"),
            ("Tell me about yourself.", "general"),
            // Chinese
            ("你好", "greeting"),
            ("你好！", "greeting"),
            ("您好吗？", "greeting"),
            ("用Python写一个函数，把列表反转", "coding"),
            ("计算 17 乘以 23", "math"),
            ("把这句话翻译成英文：今天天气很好", "translation"),
            ("请总结这篇文章的要点", "summarization"),
            ("写一首关于大海的诗", "creative_writing"),
            ("法国的首都是哪里？", "factual_qa"),
            ("为什么天空是蓝色的", "factual_qa"),
            ("我今天很开心。", "general"),
            // Japanese
            ("こんにちは", "greeting"),
            ("おはようございます！", "greeting"),
            ("このコードのバグを直してください", "coding"),
            ("この方程式を解いてください", "math"),
            ("この文を英語に翻訳してください", "translation"),
            ("この記事を要約してください", "summarization"),
            ("海についての詩を書いてください", "creative_writing"),
            ("日本の首都はどこですか？", "factual_qa"),
            ("今日は楽しかった。", "general"),
        ];
        for (text, expected) in cases {
            assert_eq!(c.classify(text), expected, "{text}");
        }
    }

    #[test]
    fn first_rule_wins_and_errors_are_reported() {
        let c = IntentClassifier::from_toml(
            "[[intent]]\nlabel='a'\npatterns=['x']\n[[intent]]\nlabel='b'\npatterns=['x']\n",
        )
        .expect("valid");
        assert_eq!(c.classify("x"), "a");
        assert!(matches!(
            IntentClassifier::from_toml("[[intent]]\nlabel='a'\npatterns=['(']\n"),
            Err(IntentRulesError::Regex(_))
        ));
    }
}
