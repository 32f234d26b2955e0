fn main() {
    eprintln!("coming");
    std::process::exit(2)
}
