//! One parser for the named values of the tools' options (`--op`, `--balance`,
//! `--exchange`, `--schedule`, `--algo`, …): a value is found by its exact name, or by an old
//! spelling that is still taken; an unknown name is an error that lists the known names and
//! the flag. An option's type keeps its values in one table (`ALL`, `name()`, and `ALIASES`
//! where it has old spellings) and gets `FromStr` and `Display` from [`crate::named!`].

/// The value of `all` named `s` exactly, or the one an old spelling in `aliases` names.
pub fn lookup<T: Copy>(
    s: &str,
    all: &[T],
    name: impl Fn(T) -> &'static str,
    aliases: &[(&'static str, T)],
) -> Option<T> {
    all.iter()
        .copied()
        .find(|v| name(*v) == s)
        .or_else(|| aliases.iter().find(|(old, _)| *old == s).map(|(_, v)| *v))
}

/// The error for a name that is no value of `flag`: "unknown FLAG `s` (known: a, b, c)".
pub fn unknown<'a>(flag: &str, s: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    let known: Vec<&str> = known.into_iter().collect();
    format!("unknown {flag} `{s}` (known: {})", known.join(", "))
}

/// [`lookup`], or the [`unknown`] error followed by `suffix`.
pub fn parse<T: Copy>(
    flag: &str,
    s: &str,
    all: &[T],
    name: impl Fn(T) -> &'static str + Copy,
    aliases: &[(&'static str, T)],
    suffix: &str,
) -> Result<T, String> {
    lookup(s, all, name, aliases)
        .ok_or_else(|| unknown(flag, s, all.iter().map(|v| name(*v))) + suffix)
}

/// `FromStr` ([`parse`]: the exact name or an old spelling; the error names `$flag` and
/// lists the known names, then `$suffix`) and `Display` (the name) for an option type with
/// `ALL` (a slice, or a function returning one) and `name()`:
/// `named!(Op, "--op")`, `named!(Exchange, "--exchange", aliases = Exchange::ALIASES)`,
/// `named!(Schedule, "--schedule", suffix = " (flag --schedule)")`.
#[macro_export]
macro_rules! named {
    ($t:ty, $flag:expr) => {
        $crate::named!($t, $flag, aliases = &[], suffix = "");
    };
    ($t:ty, $flag:expr, aliases = $aliases:expr) => {
        $crate::named!($t, $flag, aliases = $aliases, suffix = "");
    };
    ($t:ty, $flag:expr, suffix = $suffix:expr) => {
        $crate::named!($t, $flag, aliases = &[], suffix = $suffix);
    };
    ($t:ty, $flag:expr, aliases = $aliases:expr, suffix = $suffix:expr) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                $crate::named::parse($flag, s, &<$t>::ALL, <$t>::name, $aliases, $suffix)
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Colour {
        Red,
        Blue,
    }

    impl Colour {
        const ALL: &'static [Colour] = &[Colour::Red, Colour::Blue];
        const fn name(self) -> &'static str {
            match self {
                Colour::Red => "red",
                Colour::Blue => "blue",
            }
        }
    }

    crate::named!(Colour, "--colour", aliases = &[("crimson", Colour::Red)]);

    #[test]
    fn names_and_old_spellings_parse_others_list_the_known_names() {
        assert_eq!("blue".parse::<Colour>(), Ok(Colour::Blue));
        assert_eq!("crimson".parse::<Colour>(), Ok(Colour::Red));
        assert_eq!(Colour::Red.to_string(), "red");
        // Exact, case-sensitive names: the old spellings are not listed as known names.
        assert_eq!(
            "Red".parse::<Colour>(),
            Err("unknown --colour `Red` (known: red, blue)".to_string())
        );
        assert_eq!(
            parse("--c", "x", Colour::ALL, Colour::name, &[], " (flag --c)"),
            Err::<Colour, _>("unknown --c `x` (known: red, blue) (flag --c)".to_string())
        );
    }
}
