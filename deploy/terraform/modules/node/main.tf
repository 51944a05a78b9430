# A fixed set of EC2 instances at addresses chosen before they exist (the root module's address
# plan), so that peers (NATS routes, Scylla seeds, item-batch's advertised replicas) can be
# written into each other's user data. Node i is in the subnet that holds private_ips[i].
variable "name" {
  description = "Name tag prefix; node i is NAME-i."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets, one per AZ."
  type        = list(string)
}

variable "private_ips" {
  description = "One address per node; node i goes into subnet_ids[i mod len(subnet_ids)], which must hold it."
  type        = list(string)
}

variable "ami_id" {
  description = "The image."
  type        = string
}

variable "instance_type" {
  description = "The instance type."
  type        = string
}

variable "security_group_ids" {
  description = "Security groups of every node."
  type        = list(string)
}

variable "instance_profile" {
  description = "The instance profile's name."
  type        = string
}

variable "kms_key_arn" {
  description = "The key the volumes are encrypted with."
  type        = string
}

variable "root_volume_gb" {
  description = "Size of the root volume."
  type        = number
}

variable "data_volume_gb" {
  description = "Size of a data volume at /dev/sdf; 0 for none."
  type        = number
  default     = 0
}

variable "user_data" {
  description = "One user data per node, in the order of private_ips."
  type        = list(string)
}


resource "aws_instance" "this" {
  count                  = length(var.private_ips)
  ami                    = var.ami_id
  instance_type          = var.instance_type
  subnet_id              = var.subnet_ids[count.index % length(var.subnet_ids)]
  private_ip             = var.private_ips[count.index]
  vpc_security_group_ids = var.security_group_ids
  iam_instance_profile   = var.instance_profile
  user_data              = var.user_data[count.index]
  monitoring             = true
  ebs_optimized          = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  maintenance_options {
    auto_recovery = "default"
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = var.root_volume_gb
    encrypted   = true
    kms_key_id  = var.kms_key_arn
  }

  dynamic "ebs_block_device" {
    for_each = var.data_volume_gb > 0 ? [1] : []
    content {
      device_name = "/dev/sdf"
      volume_type = "gp3"
      volume_size = var.data_volume_gb
      encrypted   = true
      kms_key_id  = var.kms_key_arn
    }
  }

  tags = { Name = "${var.name}-${count.index}" }

  lifecycle {
    # A new image or user data (cloud-init runs it on the first boot only) changes no running
    # node: roll them one at a time, `tofu apply -replace='module.nats.module.nodes.aws_instance.this[0]'`.
    ignore_changes = [ami, user_data]
  }
}

output "instance_ids" {
  description = "The nodes' instance ids, in the order of private_ips."
  value       = aws_instance.this[*].id
}
