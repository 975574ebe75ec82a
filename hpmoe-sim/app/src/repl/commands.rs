//! The table of REPL commands: names, arguments, one-line summaries and the long help that
//! `:help COMMAND` prints. Completion and the dispatcher read the same table.

/// One `:command`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CommandInfo {
    pub name: &'static str,
    pub args: &'static str,
    pub summary: &'static str,
    pub help: &'static str,
}

pub(crate) const COMMANDS: &[CommandInfo] = &[
    CommandInfo {
        name: "load",
        args: "[FILE]",
        summary: "load a program (without FILE: reload the current one)",
        help: "Replaces the session with the program in FILE and checks it. Definitions typed at the\n\
               prompt are dropped. Loading another file also drops the settings made with :set;\n\
               reloading the same file (`:load` alone) keeps them.",
    },
    CommandInfo {
        name: "set",
        args: "NAME = VALUE",
        summary: "set a param, device.FIELD, device, routing, policy or taskflow",
        help: "  :set tokens = 64                    a param (overrides its definition)\n\
               \x20 :set device.link_latency = 2 us      a device field (a unit may follow the number)\n\
               \x20 :set device = ascend_910b3          the device profile\n\
               \x20 :set routing = zipf(s: 1.2)         the routing (`NAME=KIND(...)` when there are several);\n\
               \x20                                     arguments not given keep their declared values\n\
               \x20 :set policy = expert_level          the scheduling policy (`default`: the program's)\n\
               \x20 :set taskflow = moe_ffn             the taskflow that :run, :show, :explain use\n\
               The program is checked again at once. A setting that breaks a program that checked\n\
               is not applied. :unset NAME drops a setting.",
    },
    CommandInfo {
        name: "unset",
        args: "NAME",
        summary: "drop a setting made with :set",
        help: "Drops a param or device field override, or the device, routing, policy or taskflow\n\
               setting, and checks the program again.",
    },
    CommandInfo {
        name: "show",
        args: "WHAT",
        summary: "params | ops [NAME] | routing | device | tasks [FILTERS] | queue RANK CORE | config | source",
        help: "  :show params                        the params and their values\n\
               \x20 :show ops [NAME]                    the operators (with their doc comments)\n\
               \x20 :show routing                       rows received per rank and per expert\n\
               \x20 :show device                        the device model and its fields\n\
               \x20 :show tasks [call=NAME] [rank=N] [engine=aic|aiv] [limit=N]\n\
               \x20                                     tasks with their core, tile and simulated times\n\
               \x20 :show queue RANK CORE               one core's queue (CORE: aic3, aiv17 or an index)\n\
               \x20 :show config                        the file, the settings and the policy\n\
               \x20 :show source                        the session's text (the file and typed definitions)\n\
               Tasks and queues are those of the last :run's policy (else the session's).",
    },
    CommandInfo {
        name: "run",
        args: "[POLICY]",
        summary: "simulate the current configuration (under POLICY)",
        help: "Lowers, verifies, schedules and simulates every taskflow (or the one chosen with\n\
               :set taskflow) and prints the report. Only the stages a change affects run again:\n\
               the check is cached by (text, settings), the compiled schedule by (program, policy)\n\
               and the simulation by the compiled schedule.",
    },
    CommandInfo {
        name: "compare",
        args: "P1 P2",
        summary: "simulate under two policies; the speedup of P2 over P1",
        help: "Runs the current configuration under both policies and prints their latency, lower\n\
               bound, utilisation and the speedup of P2 over P1, e.g. `:compare kernel_by_kernel interleaved`.",
    },
    CommandInfo {
        name: "explain",
        args: "[TASK | last] [all]",
        summary: "why a task started when it did",
        help: "Walks back from TASK (a task id, see :show tasks; `last`, the default, is the task that\n\
               ended last) to the start of the run. Each link is what the task waited for last: a\n\
               dependency (the predecessor whose signal arrived last; `over the link` when it came\n\
               from another rank) or a busy core (the previous task of its queue). Long runs of one\n\
               busy core are folded, and at most 60 links are printed unless `all` is given.",
    },
    CommandInfo {
        name: "trace",
        args: "FILE [ranks=LIST] [window=A..B]",
        summary: "write a Chrome trace (Perfetto) of the run",
        help: "Writes the simulated run of the last :run's policy as Chrome trace event JSON. `ranks=0,3`\n\
               or `ranks=0-3` keeps some ranks; `window=100..250` keeps a time window (microseconds).",
    },
    CommandInfo {
        name: "gantt",
        args: "FILE [ranks=LIST] [window=A..B]",
        summary: "write a Gantt chart (SVG) of the run",
        help: "Writes an SVG chart of the core timelines (rank 0 unless `ranks=` says otherwise).",
    },
    CommandInfo {
        name: "dump",
        args: "DIR [seed=N] [bf16]",
        summary: "compute the real numbers of the current configuration; .npy files into DIR",
        help: "Executes every task's arithmetic in f32 in the simulated order, compares the outputs\n\
               with the dense and per-token references, and writes inputs, outputs and routings as\n\
               .npy files into DIR. `seed=N` seeds the random inputs (default 0); `bf16` rounds\n\
               stores of bf16 tensors to bf16 as the device does. Use small sizes (e.g. :set\n\
               tokens = 16, :set hidden = 64): the reference computations are slow.",
    },
    CommandInfo {
        name: "help",
        args: "[COMMAND]",
        summary: "the commands, or one in detail",
        help: "Lists the commands, or explains one (`:help set`).",
    },
    CommandInfo {
        name: "quit",
        args: "",
        summary: "leave the session (also Ctrl-D)",
        help: "Leaves the session. In a script, the exit code is 1 if any command failed.",
    },
];

/// Short forms accepted besides unique prefixes.
const ALIASES: &[(&str, &str)] = &[("q", "quit"), ("exit", "quit"), ("h", "help"), ("?", "help")];

/// Finds a command by name, alias or unique prefix.
pub(crate) fn lookup(name: &str) -> Result<&'static CommandInfo, String> {
    if let Some(c) = COMMANDS.iter().find(|c| c.name == name) {
        return Ok(c);
    }
    if let Some((_, full)) = ALIASES.iter().find(|(a, _)| *a == name) {
        if let Some(c) = COMMANDS.iter().find(|c| c.name == *full) {
            return Ok(c);
        }
    }
    let matches: Vec<&CommandInfo> = if name.is_empty() {
        Vec::new()
    } else {
        COMMANDS.iter().filter(|c| c.name.starts_with(name)).collect()
    };
    match matches.as_slice() {
        [one] => Ok(one),
        [] => {
            let hint = match hpmoe_dsl::suggest::closest(name, COMMANDS.iter().map(|c| c.name)) {
                Some(b) => format!("did you mean `:{b}`?"),
                None => "`:help` lists the commands".to_string(),
            };
            Err(format!("unknown command `:{name}`: {hint}"))
        }
        many => {
            let names: Vec<String> = many.iter().map(|c| format!(":{}", c.name)).collect();
            Err(format!("`:{name}` is ambiguous: {}", names.join(", ")))
        }
    }
}

/// The list `:help` prints.
pub(crate) fn overview() -> String {
    let mut s = String::from("commands:\n");
    for c in COMMANDS {
        let head = if c.args.is_empty() {
            format!(":{}", c.name)
        } else {
            format!(":{} {}", c.name, c.args)
        };
        if head.len() > 24 {
            s.push_str(&format!("  {head}\n  {:<24} {}\n", "", c.summary));
        } else {
            s.push_str(&format!("  {head:<24} {}\n", c.summary));
        }
    }
    s.push_str(
        "definitions: type an item (param, op, comm, taskflow, route, schedule, device, import) to\n\
         add it to the session; a redefinition replaces the old item. An unclosed bracket\n\
         continues the input on the next line.\n",
    );
    s
}

/// The long help of one command.
pub(crate) fn detail(c: &CommandInfo) -> String {
    let head = if c.args.is_empty() {
        format!(":{}", c.name)
    } else {
        format!(":{} {}", c.name, c.args)
    };
    format!("{head}\n  {}\n\n{}\n", c.summary, c.help)
}
