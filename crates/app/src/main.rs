//! The `hapwright` command line.

fn main() {
    println!("hapwright {}", env!("CARGO_PKG_VERSION"));
}
