//! The e2e harness's own pure helpers.

use std::collections::BTreeMap;

use hapwright_e2e::{MasterProcs, parse_show_proc, replace_numbers};

#[test]
fn numbers_are_replaced_whole() {
    let map = BTreeMap::from([("9101", "19102".to_owned()), ("9102", "9101".to_owned())]);
    assert_eq!(
        replace_numbers("a 9101 b 9102 c 19101 127.0.0.1:9101", &map),
        "a 19102 b 9101 c 19101 127.0.0.1:19102"
    );
}

#[test]
fn show_proc_parses() {
    let text = "#<PID>          <type>          <reloads>       <uptime>        <version>\n\
                7886            master          2 [failed: 0]   0d00h00m05s     2.6.12\n\
                # workers\n\
                7901            worker          0               0d00h00m01s     2.6.12\n\
                7889            worker          1               0d00h00m05s     2.6.12\n\
                # programs\n";
    assert_eq!(
        parse_show_proc(text),
        Some(MasterProcs {
            master_pid: 7886,
            reloads: 2,
            workers: vec![7901, 7889],
        })
    );
}
