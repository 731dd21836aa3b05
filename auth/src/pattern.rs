//! Stream-name patterns (an exact name, or `*` for any run of characters) and the grants built
//! from them. Matching is linear in the name and the pattern; nothing here allocates per match.

use crate::Action;

/// Patterns one grant list may hold (a token's `publish` or `subscribe`, or an anonymous flag).
pub const PATTERNS_MAX: usize = 256;
/// Bytes one pattern may have.
pub const PATTERN_BYTES_MAX: usize = 256;

/// Whether `name` matches `pattern`: equal, or with each `*` in `pattern` standing for any run
/// of characters (possibly empty). Several `*` are allowed; there is no escape.
///
/// Linear time, with no backtracking: the text before the first `*` must start `name`, the text
/// after the last `*` must end it, and each piece between two stars is found in turn, leftmost
/// first, in what is left (taking the leftmost match is never worse: it leaves the most room for
/// the pieces after it). Each search is `str::find` (two-way: linear), and the searches run over
/// successive parts of the name.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let Some(first_star) = pattern.find('*') else {
        return pattern == name;
    };
    let last_star = pattern.rfind('*').unwrap_or(first_star);
    let prefix = &pattern[..first_star];
    let suffix = &pattern[last_star + 1..];
    if name.len() < prefix.len() + suffix.len()
        || !name.starts_with(prefix)
        || !name.ends_with(suffix)
    {
        return false;
    }
    // Both slice points are char boundaries: `name` starts with `prefix` and ends with
    // `suffix`, and the length check keeps them in order.
    let mut rest = &name[prefix.len()..name.len() - suffix.len()];
    if first_star == last_star {
        return true;
    }
    for piece in pattern[first_star + 1..last_star].split('*') {
        if piece.is_empty() {
            continue;
        }
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// Why a list of patterns was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatternError {
    /// More than [`PATTERNS_MAX`] patterns.
    TooMany { count: usize },
    /// The pattern at `index` has more than [`PATTERN_BYTES_MAX`] bytes.
    TooLong { index: usize, bytes: usize },
}

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatternError::TooMany { count } => {
                write!(f, "{count} patterns (at most {PATTERNS_MAX})")
            }
            PatternError::TooLong { index, bytes } => write!(
                f,
                "pattern {index} has {bytes} bytes (at most {PATTERN_BYTES_MAX})"
            ),
        }
    }
}

/// Checks a list against the limits.
pub(crate) fn check_patterns(list: &[String]) -> Result<(), PatternError> {
    if list.len() > PATTERNS_MAX {
        return Err(PatternError::TooMany { count: list.len() });
    }
    match list.iter().position(|p| p.len() > PATTERN_BYTES_MAX) {
        Some(index) => Err(PatternError::TooLong {
            index,
            bytes: list[index].len(),
        }),
        None => Ok(()),
    }
}

/// The streams one holder may publish to and subscribe to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Grants {
    publish: Box<[Box<str>]>,
    subscribe: Box<[Box<str>]>,
}

impl Grants {
    /// Grants from two lists already checked with [`check_patterns`].
    pub(crate) fn new(publish: Vec<String>, subscribe: Vec<String>) -> Grants {
        let compile = |v: Vec<String>| v.into_iter().map(String::into_boxed_str).collect();
        Grants {
            publish: compile(publish),
            subscribe: compile(subscribe),
        }
    }

    /// Whether any pattern is granted at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.publish.is_empty() && self.subscribe.is_empty()
    }

    /// Whether `action` on `stream` is granted.
    pub(crate) fn allows(&self, action: Action, stream: &str) -> bool {
        let list = match action {
            Action::Publish => &self.publish,
            Action::Subscribe => &self.subscribe,
        };
        list.iter().any(|p| pattern_matches(p, stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: the textbook recursive matcher (exponential in the worst case, so only
    /// for small inputs).
    fn reference(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| reference(rest, &n[i..])),
            Some((c, rest)) => n.first() == Some(c) && reference(rest, &n[1..]),
        }
    }

    #[test]
    fn examples() {
        assert!(pattern_matches("orders", "orders"));
        assert!(!pattern_matches("orders", "orders2"));
        assert!(pattern_matches("*", ""));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("orders.*", "orders.eu"));
        assert!(pattern_matches("orders.*", "orders."));
        assert!(!pattern_matches("orders.*", "orders"));
        assert!(pattern_matches("*.eu", "orders.eu"));
        assert!(pattern_matches("a*b*c", "abc"));
        assert!(pattern_matches("a*b*c", "axxbyyc"));
        assert!(!pattern_matches("a*b*c", "axxcyyb"));
        assert!(
            !pattern_matches("ab*ba", "aba"),
            "prefix and suffix must not overlap"
        );
        assert!(pattern_matches("**", "x"));
        assert!(pattern_matches("é*ü", "éaü"));
        assert!(!pattern_matches("", "x"));
        assert!(pattern_matches("", ""));
    }

    #[test]
    fn pathological_pattern_is_linear() {
        let name = "a".repeat(10_000);
        assert!(!pattern_matches("*a*a*a*a*a*a*b", &name));
        assert!(pattern_matches("*a*a*a*a*a*a*a", &name));
        let long = format!("{}b", "*a".repeat(100));
        assert!(!pattern_matches(&long, &name));
    }

    #[test]
    fn limits() {
        let ok: Vec<String> = vec!["x".repeat(PATTERN_BYTES_MAX); PATTERNS_MAX];
        assert_eq!(check_patterns(&ok), Ok(()));
        let many: Vec<String> = vec!["x".into(); PATTERNS_MAX + 1];
        assert_eq!(
            check_patterns(&many),
            Err(PatternError::TooMany {
                count: PATTERNS_MAX + 1
            })
        );
        let long = vec!["a".into(), "x".repeat(PATTERN_BYTES_MAX + 1)];
        assert_eq!(
            check_patterns(&long),
            Err(PatternError::TooLong {
                index: 1,
                bytes: PATTERN_BYTES_MAX + 1
            })
        );
    }

    #[test]
    fn grants_by_action() {
        let g = Grants::new(vec!["pub.*".into()], vec!["sub.*".into(), "both".into()]);
        assert!(g.allows(Action::Publish, "pub.x"));
        assert!(!g.allows(Action::Subscribe, "pub.x"));
        assert!(g.allows(Action::Subscribe, "sub.x"));
        assert!(g.allows(Action::Subscribe, "both"));
        assert!(!g.allows(Action::Publish, "both"));
        assert!(Grants::default().is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn matches_the_reference(p in "[ab*]{0,8}", n in "[ab]{0,10}") {
            prop_assert_eq!(pattern_matches(&p, &n), reference(p.as_bytes(), n.as_bytes()));
        }

        #[test]
        fn matches_the_reference_wider(p in "[abc.*é]{0,10}", n in "[abc.é]{0,14}") {
            prop_assert_eq!(pattern_matches(&p, &n), reference(p.as_bytes(), n.as_bytes()));
        }
    }
}
