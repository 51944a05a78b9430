//! The per-item command: an argv whose arguments may hold `{uri}`, `{output}`, `{item}` and
//! `{attempt}` (`{{` and `}}` are literal braces), or a built-in run by the agent itself:
//! `kiln:noop` (succeeds at once), `kiln:sleep MS` (succeeds after MS milliseconds; for
//! simulations and benchmarks) or `kiln:echo WORDS…` (prints its arguments as one line and
//! succeeds; for tests and benchmarks of the item lines).

use crate::error::{Error, Result};

/// The placeholders a command may use.
pub const PLACEHOLDERS: [&str; 4] = ["uri", "output", "item", "attempt"];
/// Built-ins run by the agent itself, without a process.
pub const BUILTINS: [&str; 3] = ["kiln:noop", "kiln:sleep", "kiln:echo"];
/// Longest command accepted, summed over its arguments (as a job's command).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// What a placeholder stands for in one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    pub uri: &'a str,
    pub output: &'a str,
    pub item: &'a str,
    pub attempt: u32,
}

enum Piece<'a> {
    Text(&'a str),
    Brace(char),
    Placeholder(&'a str),
}

fn pieces(arg: &str) -> std::result::Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = arg;
    while !rest.is_empty() {
        if let Some(tail) = rest.strip_prefix("{{") {
            out.push(Piece::Brace('{'));
            rest = tail;
        } else if let Some(tail) = rest.strip_prefix("}}") {
            out.push(Piece::Brace('}'));
            rest = tail;
        } else if let Some(tail) = rest.strip_prefix('{') {
            let end = tail.find('}').ok_or_else(|| {
                format!("command argument {arg:?} opens a placeholder it does not close (write {{{{ for a brace)")
            })?;
            let name = &tail[..end];
            if !PLACEHOLDERS.contains(&name) {
                return Err(format!(
                    "unknown placeholder {{{name}}} in command argument {arg:?}; the placeholders are {{uri}}, {{output}}, {{item}} and {{attempt}}"
                ));
            }
            out.push(Piece::Placeholder(name));
            rest = &tail[end + 1..];
        } else if rest.starts_with('}') {
            return Err(format!(
                "command argument {arg:?} has a stray '}}' (write }}}} for a brace)"
            ));
        } else {
            let end = rest.find(['{', '}']).unwrap_or(rest.len());
            out.push(Piece::Text(&rest[..end]));
            rest = &rest[end..];
        }
    }
    Ok(out)
}

/// Checks a command template; the message says what is wrong.
pub fn validate(command: &[String]) -> Result<()> {
    check(command).map_err(Error::Template)
}

fn check(command: &[String]) -> std::result::Result<(), String> {
    let Some(program) = command.first() else {
        return Err("the command is empty: give the program to run per item".into());
    };
    if program.is_empty() {
        return Err("the command's program is empty: give the program to run per item".into());
    }
    let bytes: usize = command.iter().map(String::len).sum();
    if bytes > MAX_COMMAND_BYTES {
        return Err(format!(
            "the command is {bytes} bytes; the limit is {MAX_COMMAND_BYTES}"
        ));
    }
    if let Some(arg) = command.iter().position(|arg| arg.contains('\0')) {
        return Err(format!(
            "command argument {arg} holds a NUL byte, which no program can be given"
        ));
    }
    if let Some(name) = program.strip_prefix("kiln:") {
        if !BUILTINS.contains(&program.as_str()) {
            return Err(format!(
                "the command names an unknown built-in kiln:{name}; the built-ins are {}",
                BUILTINS.join(", ")
            ));
        }
        return match (program.as_str(), &command[1..]) {
            ("kiln:noop", []) => Ok(()),
            ("kiln:sleep", [ms]) if ms.parse::<u64>().is_ok_and(|ms| ms <= 3_600_000) => Ok(()),
            ("kiln:sleep", _) => Err("the command kiln:sleep takes one argument: milliseconds, at most 3600000".into()),
            ("kiln:echo", words) => words.iter().try_for_each(|word| pieces(word).map(drop)),
            _ => Err(format!("the command {program} (a built-in) takes no arguments")),
        };
    }
    for arg in command {
        pieces(arg)?;
    }
    Ok(())
}

/// Fills in a validated template.
pub fn render(command: &[String], values: Values<'_>) -> Vec<String> {
    command
        .iter()
        .map(|arg| {
            let mut out = String::with_capacity(arg.len());
            for piece in pieces(arg).unwrap_or_default() {
                match piece {
                    Piece::Text(text) => out.push_str(text),
                    Piece::Brace(brace) => out.push(brace),
                    Piece::Placeholder("uri") => out.push_str(values.uri),
                    Piece::Placeholder("output") => out.push_str(values.output),
                    Piece::Placeholder("item") => out.push_str(values.item),
                    Piece::Placeholder(_) => out.push_str(&values.attempt.to_string()),
                }
            }
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn placeholders_are_filled_in_and_braces_escaped() {
        let command = argv(&["sh", "-c", "cp {uri} {output}/x.{item} && echo {{{attempt}}}"]);
        validate(&command).unwrap();
        let values = Values {
            uri: "s3://b/k",
            output: "/out",
            item: "k1",
            attempt: 2,
        };
        assert_eq!(render(&command, values)[2], "cp s3://b/k /out/x.k1 && echo {2}");
    }

    #[test]
    fn bad_templates_are_named() {
        assert!(validate(&[]).unwrap_err().to_string().contains("empty"));
        assert!(
            validate(&argv(&["echo", "{url}"]))
                .unwrap_err()
                .to_string()
                .contains("unknown placeholder {url}")
        );
        assert!(
            validate(&argv(&["echo", "{uri"]))
                .unwrap_err()
                .to_string()
                .contains("does not close")
        );
        assert!(
            validate(&argv(&["echo", "a}b"]))
                .unwrap_err()
                .to_string()
                .contains("stray")
        );
        assert!(
            validate(&argv(&["kiln:teleport"]))
                .unwrap_err()
                .to_string()
                .contains("unknown built-in")
        );
        assert!(validate(&argv(&["kiln:noop", "x"])).is_err());
        validate(&argv(&["kiln:noop"])).unwrap();
        validate(&argv(&["kiln:sleep", "250"])).unwrap();
        assert!(validate(&argv(&["kiln:sleep"])).is_err());
        assert!(validate(&argv(&["kiln:sleep", "soon"])).is_err());
        validate(&argv(&["kiln:echo", "saw", "{uri}", "of", "{item}"])).unwrap();
        validate(&argv(&["kiln:echo"])).unwrap();
        assert!(
            validate(&argv(&["kiln:echo", "{url}"]))
                .unwrap_err()
                .to_string()
                .contains("{url}")
        );
    }

    // === properties ===

    use proptest::prelude::*;

    const VALUES: Values<'static> = Values {
        uri: "s3://bucket/k",
        output: "/out",
        item: "k1",
        attempt: 3,
    };

    /// A piece of an argument, and what it renders to.
    fn piece() -> impl Strategy<Value = (String, String)> {
        prop_oneof![
            "[^{}\\x00]{0,12}".prop_map(|text| (text.clone(), text)),
            Just(("{{".to_string(), "{".to_string())),
            Just(("}}".to_string(), "}".to_string())),
            Just(("{uri}".to_string(), VALUES.uri.to_string())),
            Just(("{output}".to_string(), VALUES.output.to_string())),
            Just(("{item}".to_string(), VALUES.item.to_string())),
            Just(("{attempt}".to_string(), VALUES.attempt.to_string())),
        ]
    }

    /// A valid command (not a built-in), and what it renders to.
    fn valid_command() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
        let arg = prop::collection::vec(piece(), 0..8).prop_map(|pieces| {
            let (template, rendered): (Vec<String>, Vec<String>) = pieces.into_iter().unzip();
            (template.concat(), rendered.concat())
        });
        ("[a-z/]{1,12}", prop::collection::vec(arg, 0..6)).prop_map(|(program, args)| {
            let (mut template, mut rendered) = (vec![program.clone()], vec![program]);
            for (arg, out) in args {
                template.push(arg);
                rendered.push(out);
            }
            (template, rendered)
        })
    }

    proptest! {
        #[test]
        fn any_command_is_answered_without_a_panic(command in prop::collection::vec(".{0,24}", 0..6)) {
            match validate(&command) {
                Ok(()) => {
                    let rendered = render(&command, VALUES);
                    prop_assert_eq!(rendered.len(), command.len());
                }
                Err(error) => prop_assert!(error.to_string().contains("command"), "{}", error),
            }
        }

        #[test]
        fn valid_commands_render_as_generated((command, rendered) in valid_command()) {
            validate(&command).map_err(|e| TestCaseError::fail(format!("{e}: {command:?}")))?;
            prop_assert_eq!(render(&command, VALUES), rendered);
        }

        #[test]
        fn a_broken_argument_is_refused_and_named(
            (mut command, _) in valid_command(),
            at in any::<prop::sample::Index>(),
            broken in prop::sample::select(vec!["{url}", "{", "}", "a}b", "{uri", "{}", "x\0y"]),
        ) {
            let i = at.index(command.len()) + 1;
            command.insert(i, broken.to_string());
            let message = validate(&command).unwrap_err().to_string();
            prop_assert!(message.contains("command argument"), "{}", message);
        }
    }
}
