//! The detection pattern, one alternation with a named group per kind (see the module
//! above for how matches are judged and replaced).

/// The detection pattern: one alternation, a named group per kind around the part that
/// is replaced (for bearer tokens and URL passwords the match is wider than the group:
/// `Bearer ` and `scheme://user:` stay). The regex crate has no look-around, so edges
/// are ASCII word boundaries (`(?-u:\b)`, which also keeps the lazy DFA on non-ASCII
/// text, where a Unicode `\b` would push it to the slow engine) and the validators
/// check what the pattern cannot.
///
/// The alternation is leftmost-first: at the same start position an earlier branch wins,
/// so secrets and the most specific shapes come first, and phones come before cards
/// (`0044 20 7946 0958` is also 14 grouped digits).
pub(super) const PATTERN: &str = concat!(
    // PEM private key, across lines. A block without its END line (text cut mid-key) is
    // still key material, so it is redacted up to where the base64 stops.
    r"(?P<private_key>-----BEGIN[A-Z ]*PRIVATE KEY-----",
    r"(?:(?s:.*?)-----END[A-Z ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s:,-]*))",
    // JWT: header and payload are base64url JSON objects, so both start with `eyJ`.
    r"|(?-u:\b)(?P<jwt>eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*)",
    // `Bearer <token>`: the word stays, the token goes. The validator tells a token from
    // the English word ("the bearer of bad news").
    r"|(?-u:\b)(?i:bearer)[ \t]+(?P<bearer_token>[A-Za-z0-9._~+/-]+=*)",
    // E-mail addresses, before the API keys: a key-shaped local part (`xoxb-...@host`) is
    // still an address, and a key branch would take its start and leave the rest behind.
    r"|(?-u:\b)(?P<email>[A-Za-z0-9_][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*",
    r"\.[A-Za-z]{2,63})(?-u:\b)",
    // Provider API keys, by their documented prefixes. Open-ended lengths are greedy,
    // so they take the whole key; fixed-length ones need a word boundary after.
    r"|(?-u:\b)(?P<api_key>sk-ant-[A-Za-z0-9_-]{20,}|sk-[A-Za-z0-9_-]{20,}",
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?-u:\b)|gh[pousr]_[A-Za-z0-9]{36,}",
    r"|github_pat_[A-Za-z0-9_]{22,}|AIza[A-Za-z0-9_-]{35}|xox[abposr]-[A-Za-z0-9-]{10,}",
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|glpat-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}",
    // This gateway's own keys (`auth::KEY_PREFIX` and 32 bytes in base64url).
    r"|llmgate-[A-Za-z0-9_-]{32,})",
    // Password in a URL's userinfo. The password may itself hold `@`; the greedy run
    // stops at the last one before the host.
    r"|(?-u:\b)[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*:(?P<password>[^\s/?#]+)@",
    // A password after its name: `DB_PASSWORD=…`, `"password": "…"`, "password: …",
    // 密码是…; the validator leaves "password is required" alone.
    r#"|(?:(?i:passw(?:or)?d|pwd|passphrase)["']?[ \t]*(?:[:=：]|is)|(?:密码|口令)(?:是|为|[:：]))"#,
    r#"[ \t]*["']?(?P<password__after>[^\s"',，。;；、）)<>]{4,64})"#,
    // IBAN: country, check digits, then 4-character groups with optional single spaces.
    r"|(?-u:\b)(?P<iban>[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?)(?-u:\b)",
    // IPv6 candidate: hex groups and colons (`::` included), optionally ending in a
    // dotted IPv4 tail. Loose on purpose; `Ipv6Addr::from_str` decides.
    r"|(?-u:\b)(?P<ipv6>[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{0,4}){2,8}(?:\.[0-9]{1,3}){0,3})",
    r"|(?-u:\b)(?P<ipv4>(?:[0-9]{1,3}\.){3}[0-9]{1,3})(?-u:\b)",
    r"|(?-u:\b)(?P<ssn>[0-9]{3}-[0-9]{2}-[0-9]{4})(?-u:\b)",
    // Nine digits in one run are an SSN only where the text says so.
    r"|(?-u:\b)(?:SSN|(?i:social\s+security\s+(?:number|no\.?)))(?:\s+is|\s*[:#])?\s*(?P<ssn__run>[0-9]{9})(?-u:\b)",
    // Chinese resident identity number: region, birth date, sequence, check character.
    // Before phones and cards: eighteen digits are also a card's length.
    // In one run or grouped 6-8-4 (6-4-4-4) with spaces or hyphens.
    r"|(?-u:\b)(?P<resident_id>[1-9][0-9]{5}[ -]?(?:18|19|20)[0-9]{2}[ -]?(?:0[1-9]|1[0-2])",
    r"(?:0[1-9]|[12][0-9]|3[01])[ -]?[0-9]{3}[0-9Xx])(?-u:\b)",
    // An answer cut off inside one (by `max_tokens`): region and birth date at least,
    // at the very end of the text.
    r"|(?-u:\b)(?P<resident_id__cut>[1-9][0-9]{5}(?:18|19|20)[0-9]{2}(?:[01]|(?:0[1-9]|1[0-2])",
    r"(?:[0-3]|(?:0[1-9]|[12][0-9]|3[01])[0-9]{0,3})?)?)[ \t]*\z",
    // Phones: `+` country code (not after a word character, so `3+4` is left alone);
    // `00` + country code with separated groups (a bare digit run is an order number,
    // not a phone); North-American `(202) 555-0143`, `202-555-0143`, `202.555.0143`.
    r"|(?P<phone>(?-u:\B)\+[1-9][0-9]{0,3}(?:[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,6}){1,7}",
    r"|(?-u:\b)00[1-9][0-9]{0,3}(?:[ .-](?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,6}){2,7}",
    r"|\([0-9]{3}\) ?[0-9]{3}[-. ][0-9]{4}",
    r"|(?-u:\b)[0-9]{3}-[0-9]{3}-[0-9]{4}|(?-u:\b)[0-9]{3}\.[0-9]{3}\.[0-9]{4}",
    // China: mobiles (11 digits from 13 to 19, `86` or `0086` before them or not, in
    // one run or 3-4-4), and landlines with their area code (`010-62345678`).
    r"|(?-u:\b)(?:(?:00)?86[ -]?)?1[3-9][0-9](?:[ -]?[0-9]{4}){2}",
    r"|(?-u:\b)0[1-9][0-9]{1,2}-[0-9]{7,8}",
    // A Chinese landline with its area code in brackets: (010) 6543 2178.
    r"|\(0[1-9][0-9]{1,2}\)[ ]?[0-9]{3,4}[ -]?[0-9]{4}",
    // A UK mobile: 07700 900461.
    r"|(?-u:\b)07[0-9]{3}[ -][0-9]{6}",
    // A national number with its trunk 0 in three groups: 020 7946 0958, 024 123 4567.
    r"|(?-u:\b)0[1-9][0-9]{1,3}[ -][0-9]{3,4}[ -][0-9]{3,4})(?-u:\b)",
    // Cards: groups of four (13-19 digits), Amex/Diners 4-6-5 and 4-6-4, or one run.
    r"|(?-u:\b)(?P<card>[0-9]{4}(?:[ -][0-9]{4}){2}[ -][0-9]{1,4}(?:[ -][0-9]{1,3})?",
    r"|[0-9]{4}[ -][0-9]{6}[ -][0-9]{4,5}|[0-9]{13,19})(?-u:\b)",
    // Names and addresses have no checksum: a cue marks them, and the validators take
    // the cue back off (see `names::name` and `names::address`). Last, so any
    // structured value starting at the same place wins.
    // "my name is Jane Doe", "hi Jane", "account holder: Jane Doe", "my roommate Noah":
    // one to three capitalised words after a cue.
    r"|(?-u:\b)(?i:my\s+name\s+is|my\s+name's|my\s+name’s|i\s+am\s+called|i'm\s+called",
    r"|call\s+me|i\s+am|i'm|i’m|it's|it’s|this\s+is|reached|hi|hey|hello|name|signed|regards",
    r"|sincerely",
    r"|holder|contact|customer|passenger|patient|policyholder|applicant|employee|recipient",
    r"|attn|(?:my\s+)?(?:friend|roommate|wife|husband|son|daughter|boss|colleague|coworker",
    r"|manager|mother|father|mom|dad|brother|sister|partner|boyfriend|girlfriend|neighbou?r",
    r"|tenant|landlord|client))[ \t]*[:,]?\s+",
    r"(?P<name__cue>\p{Lu}[\p{Ll}'’-]+(?:[ \t]+\p{Lu}[\p{Ll}'’-]+){0,2})",
    // "Dear Jane", "Dr. Chen": the title stays.
    r"|(?-u:\b)(?:[Dd]ear|Mr|Mrs|Ms|Miss|Mx|Dr|Prof)\.?[ \t]+",
    r"(?P<name__title>\p{Lu}[\p{Ll}'’-]+(?:[ \t]+\p{Lu}[\p{Ll}'’-]+){0,2})",
    // 我叫王小明, 姓名：张三, 收件人：李四: the name runs on into the next words (Chinese
    // has no spaces); the validator keeps a surname and one or two given characters.
    r"|(?:我叫|我是|我的名字是|我的名字叫|名字叫|名叫|本人|配偶|(?:姓名|联系人|收件人|收货人|寄件人",
    r"|乘机人|乘车人|患者|申请人|户名为?|持卡人|账户名|客户|学生|员工表?|经办人|家长|业主|收款人",
    r"|付款人|师傅|负责人|担保人|法人|房东|租客)[:：]?)[ \t]*(?P<name__zh>\p{Han}{2,4})",
    // 王小明先生, 李老师 is only a surname and stays.
    r"|(?P<name__honorific>\p{Han}{2,4})(?:先生|女士|小姐|老师|同学|医生|经理|律师|教授|的家长",
    r"|的妈妈|的爸爸|的家属)",
    // A number, zero to four capitalised words, a street word, then what may follow:
    // a flat, a town or two, a state and a ZIP code.
    // A flat or suite may come first: "Apt 12C, 455 West 37th Street".
    r"|(?-u:\b)(?P<address__en>(?:(?:Apt|Apartment|Suite|Ste|Unit|Flat|Room|Rm|Level|Floor)\.?[ \t]*\#?",
    r"[0-9A-Za-z-]{1,6},?[ \t]+)?",
    // "2207-88 Harbour Street" (flat 2207 of number 88), "4/17 Gladstone Parade".
    r"(?:[0-9]{1,5}[-/])?[0-9]{1,6}[A-Za-z]?[ \t]+",
    r"(?:(?:\p{Lu}\p{Ll}*\.?|[0-9]{1,4}(?:st|nd|rd|th))[ \t]+){0,4}",
    r"(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Terrace|Court|Ct|Place",
    r"|Pl|Way|Parkway|Pkwy|Square|Sq|Circle|Highway|Hwy|Crescent|Close|Row|Alley|Plaza|Trail",
    r"|Center|Centre|Parade|Quay|Wharf|Grove|Gardens|Mews|Walk)",
    r"(?-u:\b)\.?(?:[ \t]+(?:North|South|East|West|[NSEW]|NE|NW|SE|SW)(?-u:\b))?",
    r"(?:,?[ \t]+(?:Apt|Apartment|Suite|Ste|Unit|Flat|Floor|\#)\.?[ \t]*[0-9A-Za-z-]+)?",
    r"(?:,[ \t]+\p{Lu}\p{Ll}+(?:[ \t]+\p{Lu}\p{Ll}+){0,2}){0,2}(?:,?[ \t]+[A-Z]{2,3}(?-u:\b))?",
    // ZIP, a UK or Canadian postcode, an Eircode, four digits (Australia, much of Europe).
    r"(?:,?[ \t]+(?:[0-9]{5}(?:-[0-9]{4})?|[A-Z]{1,2}[0-9][A-Z0-9]?[ \t]?[0-9][A-Z]{2}",
    r"|[AC-FHKNPRTV-Y][0-9]{2}[ \t]?[0-9AC-FHKNPRTV-Y]{4}",
    r"|[A-Z][0-9][A-Z][ \t]?[0-9][A-Z][0-9]|[0-9]{4})(?-u:\b))?",
    // "12 Rue de Rivoli, 75004 Paris", "8 Via Roma": the street word first.
    r"|[0-9]{1,5}(?:bis|ter)?,?[ \t]+(?:[Rr]ue|[Aa]venue|[Bb]oulevard|[Pp]lace|[Cc]hemin|[Aa]llée",
    r"|[Qq]uai|[Vv]ia|[Vv]iale|[Cc]alle|[Rr]ua|[Aa]venida)(?:[ \t]+[\p{L}'’-]+){1,4}",
    r"(?:,[ \t]+[0-9]{4,5}[ \t]+\p{Lu}\p{Ll}+)?",
    r"(?:,?[ \t]+(?:Apt|Apartment|Suite|Unit|Flat|App)\.?[ \t]*[0-9A-Za-z-]+)?",
    r"(?:,[ \t]+\p{Lu}\p{Ll}+(?:[ \t-]+\p{Lu}\p{Ll}+){0,2})?(?:,?[ \t]+[A-Z]{2}(?-u:\b))?",
    r"(?:,?[ \t]+[A-Z][0-9][A-Z][ \t]?[0-9][A-Z][0-9](?-u:\b))?",
    // Parts of an address set apart by commas, ending in a postcode that says it is one
    // (UK, Irish Eircode, Australian state and number): a house with a name, a flat
    // first ("The Old Rectory, Church Lane, Little Snoring, NR21 0AX"; "Flat 9, Kingsley
    // Court, 4 Mill Lane, Bristol BS1 6QA"; "Rosebank House, Ballyvolane, Co. Cork, T23
    // X4K7"). A PO box: its town, then a state and a ZIP or a Canadian postal code.
    r"|(?:(?:Flat|Apartment|Apt|Unit|Suite)[ \t]+[0-9A-Za-z]{1,5},[ \t]+)?",
    r"(?:[0-9]{1,5}[A-Za-z]?[ \t]+)?\p{Lu}[\p{L}'’.-]*(?:[ \t]+\p{Lu}[\p{L}'’.-]*){0,3}",
    r"(?:,[ \t]+(?:[0-9]{1,5}[A-Za-z]?[ \t]+)?\p{Lu}[\p{L}'’.-]*(?:[ \t]+\p{Lu}[\p{L}'’.-]*){0,3}){1,4}",
    r",?[ \t]+(?:[A-Z]{1,2}[0-9][A-Z0-9]?[ \t][0-9][A-Z]{2}|[AC-FHKNPRTV-Y][0-9]{2}[ \t][0-9AC-FHKNPRTV-Y]{4}",
    r"|(?:NSW|VIC|QLD|SA|WA|TAS|NT|ACT)[ \t]+[0-9]{4})(?-u:\b)",
    r"|(?-u:\b)P\.?[ \t]?O\.?[ \t]+Box[ \t]+[0-9]{1,6}(?:,[ \t]+\p{Lu}\p{Ll}+(?:[ \t]+\p{Lu}\p{Ll}+){0,2}){1,3}",
    r",?[ \t]+[A-Z]{2,3}[ \t]+(?:[0-9]{4,5}(?:-[0-9]{4})?|[A-Z][0-9][A-Z][ \t]?[0-9][A-Z][0-9])(?-u:\b))",
    // China's chain: province, city, district, road and number (the number, or a city
    // and district before the road, must be there). The chain runs on backwards into
    // the words before it; the validator cuts those off (住在, 寄到).
    r"|(?P<address__zh>(?:\p{Han}{2,3}省|\p{Han}{2,6}自治区)?(?:\p{Han}{2,4}市)?(?:\p{Han}{1,4}(?:区|县|旗))?",
    r"(?:\p{Han}{1,10}(?:路|街|大道|道|巷|弄|胡同)(?:(?:[0-9]{1,3}|[一二三四五六七八九十]{1,3})段)?",
    r"(?:[0-9]{1,5}弄)?",
    r"(?:[0-9]{1,5}|[一二三四五六七八九十百零]{1,5})[号號]",
    // Then a building and its parts: 软件园5号楼, SOHO现代城C座1806, 大厦23楼.
    r"(?:[\p{Han}A-Za-z]{0,12}(?:[0-9A-Za-z]{1,5}|[一二三四五六七八九十]{1,3})",
    r"(?:号楼|号院|号厂房|号库房|栋|幢|座|单元|楼|层|室|号|期|厂房|库房|商铺|铺)",
    r"|\p{Han}{1,8}(?:大厦|广场|中心|大楼|公寓|花园|小区|山庄|苑|园))*",
    r"(?:[0-9]{1,5}(?:-[0-9]{1,4})?)?",
    r"|\p{Han}{2,4}市\p{Han}{1,4}(?:区|县)\p{Han}{1,6}(?:路|街|大道|巷|弄|胡同)",
    // A city and district, then a residential compound's building: 望京西园三区312号楼2单元,
    // 五常街道西溪北苑二期17幢1单元502室.
    r"|\p{Han}{2,4}市\p{Han}{1,4}(?:区|县)\p{Han}{1,14}?(?:[0-9]{1,5}|[一二三四五六七八九十]{1,3})",
    r"(?:号楼|栋|幢|座)(?:[0-9A-Za-z]{1,5}(?:单元|层|楼|室))*(?:[0-9]{1,5}(?:-[0-9]{1,4})?室?)?",
    // A village: county or district, town (镇, 乡), village (村), its group (组) and number.
    r"|(?:\p{Han}{2,3}省)?(?:\p{Han}{2,4}市)?\p{Han}{1,4}(?:县|区|市)\p{Han}{1,5}(?:镇|乡)\p{Han}{1,5}村",
    r"(?:\p{Han}{1,3}组|[0-9一二三四五六七八九十]{1,3}组)?(?:[0-9]{1,4}号)?))",
);

/// The lazy DFA's cache per thread (the regex crate's default is 2 MiB). Past its size
/// the DFA is rebuilt over and over and then given up for the PikeVM, the slowest of
/// the crate's engines: with 2 MiB the pattern ran at 0.3 MB/s in `benches/redaction.rs`.
/// What the pattern fills is far less than this (~4 MB); the limit is room, not memory.
pub(super) const DFA_CACHE_BYTES: usize = 16 << 20;

/// [`PATTERN`] as compiled: each Unicode letter class becomes the few ranges of the
/// scripts it is written for. `\p{Lu}` alone is some 640 ranges (upper and lower case
/// alternate through Latin Extended), and each copy in a counted repetition is a large
/// UTF-8 automaton: a process holding the pattern with them took 28 MB, with these 15 MB,
/// and ran at half the speed (issue 61's address rules repeat them most). Latin-1's
/// letters, Greek's and Cyrillic's keep their case; in Latin Extended-A/B and Cyrillic's
/// supplement, where the two cases alternate letter by letter, a letter of either case is
/// taken as both; Han is the CJK Unified Ideographs, Extension A and the compatibility
/// ideographs.
pub(super) fn compiled() -> String {
    const HAN: &str = r"[\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}]";
    const UPPER: &str = concat!(
        r"[A-Z\x{C0}-\x{D6}\x{D8}-\x{DE}\x{100}-\x{24F}",
        r"\x{386}\x{388}-\x{38F}\x{391}-\x{3AB}\x{400}-\x{42F}\x{460}-\x{52F}]"
    );
    const LOWER: &str = concat!(
        r"[a-z\x{DF}-\x{F6}\x{F8}-\x{FF}\x{100}-\x{24F}",
        r"\x{3AC}-\x{3CE}\x{430}-\x{45F}\x{460}-\x{52F}]"
    );
    const LETTER: &str = r"[A-Za-z\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{24F}\x{386}-\x{52F}]";
    // A class inside a class is their union, so the same text serves `\p{L}` alone and
    // within `[\p{L}'’-]`.
    PATTERN
        .replace(r"\p{Han}", HAN)
        .replace(r"\p{Lu}", UPPER)
        .replace(r"\p{Ll}", LOWER)
        .replace(r"\p{L}", LETTER)
}

#[cfg(test)]
mod tests {
    use crate::redact::{Kind, Mode, RedactionCounts, Redactor};

    #[test]
    fn the_compiled_pattern_has_no_unicode_property_class_left() {
        // A new rule with another class (`\p{N}`, `\w` under Unicode) would bring back
        // the large automata `compiled` removes: spell it as ranges there.
        let compiled = super::compiled();
        assert!(!compiled.contains(r"\p{"), "a \\p{{..}} class is left");
        assert!(
            super::PATTERN.contains(r"\p{Lu}"),
            "the classes are replaced, not absent"
        );
    }

    fn found(text: &str) -> Vec<(Kind, &str)> {
        Redactor::default()
            .find(text)
            .into_iter()
            .map(|(kind, range)| (kind, &text[range]))
            .collect()
    }

    #[test]
    fn resident_ids_in_any_grouping_and_cut_off_ones() {
        for id in [
            "110105199003072311",
            "110105 19900307 2311",
            "110105-19900307-2311",
        ] {
            assert_eq!(
                found(&format!("身份证 {id} 谢谢")),
                [(Kind::ResidentId, id)]
            );
        }
        // An answer cut by max_tokens in the middle of one: region and birth date go.
        assert_eq!(
            found("他的身份证号码是11010519900307"),
            [(Kind::ResidentId, "11010519900307")]
        );
        assert_eq!(
            found("号码是3502031989"),
            [(Kind::ResidentId, "3502031989")]
        );
        // Not at the end, or no province's code: a number like any other.
        assert!(found("订单11010519900307已发货").is_empty());
        assert!(found("订单号9901051990030").is_empty());
    }

    #[test]
    fn passwords_after_their_name_and_phones_in_more_shapes() {
        assert_eq!(
            found("DB_USER=app DB_PASSWORD=Tr0ub4dor&3"),
            [(Kind::Password, "Tr0ub4dor&3")]
        );
        assert_eq!(
            found("原密码是Lx19900307，能重置吗"),
            [(Kind::Password, "Lx19900307")]
        );
        assert_eq!(
            found(r#""password": "Qw3rty!2024""#),
            [(Kind::Password, "Qw3rty!2024")]
        );
        for clean in [
            "password is required",
            "password: ${DB_PASS}",
            "password=********",
            "密码里有特殊字符吗？",
        ] {
            assert!(found(clean).is_empty(), "{clean}");
        }
        // In keyed-hash mode the placeholder reads `<PASSWORD:…>`: no password after it.
        let keyed = Redactor::new(Mode::KeyedHash(b"a key of sixteen+".to_vec()));
        let mut counts = RedactionCounts::default();
        let once = keyed.redact("password: hunter22 and postgres://a:b0b@h/db", &mut counts);
        assert_eq!(counts.get(Kind::Password), 2);
        assert_eq!(keyed.redact(once.as_str(), &mut counts), once);
        assert_eq!(counts.get(Kind::Password), 2);
        assert_eq!(
            found("mobile 07700 900461"),
            [(Kind::Phone, "07700 900461")]
        );
        assert_eq!(
            found("电话(010) 6543 2178"),
            [(Kind::Phone, "(010) 6543 2178")]
        );
    }

    #[test]
    fn addresses_with_the_flat_first_a_named_house_or_a_village() {
        for address in [
            "Apt 12C, 455 West 37th Street, New York, NY 10018",
            "201 East 86th Street, Apt 4R, New York, NY 10028",
            "The Old Rectory, Church Lane, Little Snoring, NR21 0AX",
            "Flat 9, Kingsley Court, 4 Mill Lane, Bristol BS1 6QA",
            "Rosebank House, Ballyvolane, Co. Cork, T23 X4K7",
            "PO Box 318, Alice Springs NT 0871",
            "2207-88 Harbour Street, Toronto, ON M5J 0C3",
            "四川省绵阳市三台县芦溪镇青龙村5组12号",
            "上海市浦东新区张江路88弄5号602室",
            "北京市朝阳区望京西园三区312号楼2单元1402",
        ] {
            let text = format!("send it to {address} please");
            assert_eq!(found(&text), [(Kind::Address, address)], "{address}");
        }
        // A city and a road without a number is no one's address.
        assert!(found("请问在成都市哪里可以办签证").is_empty());
    }
}
