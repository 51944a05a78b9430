# The resources kiln-provisioner's role may launch runners from and into, as ARNs: the statement
# LaunchFromThePools of modules/services/provisioner-iam.tf. No provider and no resource (the
# caller gives the partition and account), so tests/render renders the list offline and checks
# it names each pool's placement group.
locals {
  ec2_arn = "arn:${var.partition}:ec2:${var.region}"
}

output "resources" {
  description = "The ARNs of the pools' launch templates, the private subnets, the runner security group, the pools' images and their snapshots, spot requests, and the pools' cluster placement groups."
  value = concat(
    var.launch.launch_template_arns,
    [for id in var.launch.subnet_ids : "${local.ec2_arn}:${var.account_id}:subnet/${id}"],
    ["${local.ec2_arn}:${var.account_id}:security-group/${var.launch.security_group_id}"],
    # Public images have no account in their ARN.
    [for id in var.launch.image_ids : "${local.ec2_arn}::image/${id}"],
    # The images' own snapshots (an EBS-backed image is launched from its snapshot), and the
    # spot request EC2 makes for each spot instance: neither can carry the request's tags.
    ["${local.ec2_arn}::snapshot/*", "${local.ec2_arn}:${var.account_id}:spot-instances-request/*"],
    # A launch into a placement group is authorized on the group too, whose ARN ends in its
    # name (not its pg- id). Only the pools' own groups: no other group the account has.
    [for name in var.launch.placement_group_names : "${local.ec2_arn}:${var.account_id}:placement-group/${name}"],
  )
}
