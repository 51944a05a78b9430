# tflint with its bundled terraform ruleset only (no plugin downloads: CI reaches no plugin
# registry), the recommended preset plus the rules that keep modules documented and tidy.
config {
  call_module_type = "local"
}

plugin "terraform" {
  enabled = true
  preset  = "recommended"
}

rule "terraform_documented_variables" {
  enabled = true
}

rule "terraform_documented_outputs" {
  enabled = true
}

rule "terraform_naming_convention" {
  enabled = true
}

rule "terraform_standard_module_structure" {
  enabled = false
}
